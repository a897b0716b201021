// attention_flash: causal multi-head softmax attention in one pass (flash-attention style), never forming
// the L x L scores: out[b, i, h, :] = sum over j <= i of softmax_j(q_i . k_j / sqrt(P)) v[b, j, h, :].
//
// One workgroup of THREADS invocations per (query tile of ROWS = THREADS / LANES rows, head, batch row).
// Each query row is served by LANES invocations ("lanes"); the lanes split the row's keys, each keeping
// its own running max m, sum l and output accumulator (online softmax), and the lanes of a row are merged
// at the end through workgroup memory (flash-decoding's merge):
//     M = max_i m_i,   l = sum_i l_i 2^(m_i - M),   out = sum_i acc_i 2^(m_i - M) / l.
// A lane that never sees a key (row 0's lanes past the first) has m_i = NEG, l_i = 0, acc_i = 0 and
// weighs nothing; lane 0 always sees key 0, so M is finite.
//
// Keys and values pass through workgroup memory KEY_TILE rows at a time (loaded one tile ahead into
// registers, so the global latency hides behind the current tile's work); tiles wholly above the
// diagonal are never loaded. A tile is KEY_TILE / 4 groups of 4 consecutive keys; lane `ln` takes groups
// ln, ln + LANES, ... and does one online-softmax step per group: 4 scores, a new max, one rescale of its
// accumulator (fused into the value update), 4 probability-weighted value rows. exp is exp2 with
// log2(e) / sqrt(P) folded into q.
//
// Registers: the scaled query row and the accumulator are up to four mat4x4 each (16 dims per matrix,
// NM = ceil(P / 16) matrices), used only with constant column indices, and no private array is indexed
// at run time anywhere, so nothing depends on the shader compiler unrolling a loop to keep a row out of
// local memory. Workgroup memory (64 bytes an invocation, 16 KiB at 256): the K tile as [dim][key]
// (vec4 = 4 consecutive keys, so 4 scores come from one fma per dim) and the V tile as
// [dim chunk][key in group][group] (vec4 = 4 dims). Invocation t is lane t / ROWS of row t % ROWS, so
// with ROWS >= 32 a warp is one lane of 32 rows: every workgroup-memory read in the inner loop is one
// vec4 broadcast to the whole warp (no bank conflicts, one transaction).
//
// q, k, v are rows of `stride` floats (B * L rows, batch-major); head h of row r is at
// r * stride + {q,k,v}_off + h * P, so a fused (B * L, 3C) projection is read in place (column slices,
// seed-001) and plain (B, L, H * P) tensors use stride = H * P, offsets 0. out is (B, L, H * P) dense.
// Pipeline constants (the host sets them): HEAD_DIM = P <= 64; THREADS; LANES, a power of two <= THREADS;
// KEY_TILE, a multiple of 4 with KEY_TILE * 4 * NM <= 2 * THREADS (the host uses THREADS / (2 NM) rounded
// down to a multiple of 4), so each invocation stages at most 2 vec4s of K and 2 of V per tile.
// Dispatch: (ceil(L / ROWS), H, B); tiles are taken last-first so the longest rows start earliest.

override HEAD_DIM: u32 = 32u;     // P
override THREADS: u32 = 256u;     // invocations per workgroup: 64, 128 or 256
override LANES: u32 = 8u;         // invocations per query row
override KEY_TILE: u32 = 64u;     // keys staged in workgroup memory per step
override SH: u32 = 4u * THREADS;  // vec4s of workgroup memory: the K and V tiles, 2 * THREADS each
const NEG: f32 = -3.0e38;         // "minus infinity" for masked scores and the initial max
const LOG2E: f32 = 1.4426950408889634;

struct Params {
    seq_len: u32, n_heads: u32, batch: u32, stride: u32,
    q_off: u32, k_off: u32, v_off: u32, _pad: u32,
};

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> k: array<f32>;
@group(0) @binding(3) var<storage, read> v: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;   // (B, L, H * P)

// K tile in [0, 2 THREADS): sh[d * T4 + g][u] = k[key 4g + u][dim d]. V tile from V0 = 2 THREADS:
// sh[V0 + (4c + u) * T4 + g] = v[key 4g + u][dims 4c .. 4c + 3]. Padding (dims past P, keys past L) is zero.
// After the last tile the same memory carries the lanes' partial results for the merge.
var<workgroup> sh: array<vec4<f32>, SH>;

fn nm() -> u32 { return (HEAD_DIM + 15u) / 16u; }     // mat4x4 blocks of 16 dims per row
fn t4() -> u32 { return KEY_TILE / 4u; }               // groups of 4 keys per tile
fn used_slots() -> u32 { return KEY_TILE * 4u * nm(); } // vec4 slots of the K (or V) tile, <= 2 THREADS
fn v0() -> u32 { return 2u * THREADS; }                // first vec4 of the V tile in `sh`
fn rows() -> u32 { return THREADS / LANES; }           // query rows per workgroup

// ---- staging ------------------------------------------------------------------------------------------

// Slot s of a tile holds (key s % KEY_TILE, dims 4c .. 4c + 3 with c = s / KEY_TILE): consecutive
// invocations take consecutive keys, so their workgroup-memory stores of K land in consecutive words.
fn fetch(is_v: bool, slot: u32, j0: u32, row0: u32, hd: u32) -> vec4<f32> {
    let j = j0 + slot % KEY_TILE;
    let d = slot / KEY_TILE * 4u;
    var r = vec4<f32>(0.0);
    if (slot < used_slots() && j < p.seq_len) {
        let base = (row0 + j) * p.stride + select(p.k_off, p.v_off, is_v) + hd * HEAD_DIM + d;
        if (is_v) {
            if (d < HEAD_DIM) { r.x = v[base]; }
            if (d + 1u < HEAD_DIM) { r.y = v[base + 1u]; }
            if (d + 2u < HEAD_DIM) { r.z = v[base + 2u]; }
            if (d + 3u < HEAD_DIM) { r.w = v[base + 3u]; }
        } else {
            if (d < HEAD_DIM) { r.x = k[base]; }
            if (d + 1u < HEAD_DIM) { r.y = k[base + 1u]; }
            if (d + 2u < HEAD_DIM) { r.z = k[base + 2u]; }
            if (d + 3u < HEAD_DIM) { r.w = k[base + 3u]; }
        }
    }
    return r;
}

fn stage(slot: u32, kv: vec4<f32>, vv: vec4<f32>) {
    if (slot < used_slots()) {
        let key = slot % KEY_TILE;
        let d = slot / KEY_TILE * 4u;
        let g = key / 4u;
        let u = key % 4u;
        let n = t4();
        sh[d * n + g][u] = kv.x;
        sh[(d + 1u) * n + g][u] = kv.y;
        sh[(d + 2u) * n + g][u] = kv.z;
        sh[(d + 3u) * n + g][u] = kv.w;
        sh[v0() + (d + u) * n + g] = vv;
    }
}

// ---- one group of 4 keys ----------------------------------------------------------------------------

// r + the scores of keys 4g .. 4g + 3 against dims d .. d + 3 of the query (q).
fn qk4(r: vec4<f32>, qv: vec4<f32>, d: u32, g: u32) -> vec4<f32> {
    let n = t4();
    let b = d * n + g;
    return fma(vec4<f32>(qv.w), sh[b + 3u * n], fma(vec4<f32>(qv.z), sh[b + 2u * n],
           fma(vec4<f32>(qv.y), sh[b + n], fma(vec4<f32>(qv.x), sh[b], r))));
}

// The scores of keys 4g .. 4g + 3 against dims 16 mi .. 16 mi + 15 (query block qm).
fn qk16(qm: mat4x4<f32>, mi: u32, g: u32) -> vec4<f32> {
    let d = 16u * mi;
    return qk4(qk4(qk4(qk4(vec4<f32>(0.0), qm[0], d, g), qm[1], d + 4u, g), qm[2], d + 8u, g), qm[3], d + 12u, g);
}

// a * corr + the probability-weighted (pr) values of keys 4g .. 4g + 3 in dims x .. x + 3.
fn pv4(a: vec4<f32>, corr: f32, pr: vec4<f32>, x: u32, g: u32) -> vec4<f32> {
    let n = t4();
    let b = v0() + x * n + g;
    return fma(vec4<f32>(pr.w), sh[b + 3u * n], fma(vec4<f32>(pr.z), sh[b + 2u * n],
           fma(vec4<f32>(pr.y), sh[b + n], fma(vec4<f32>(pr.x), sh[b], a * corr))));
}

// Accumulator block am (dims 16 mi .. 16 mi + 15) rescaled by corr, plus the group's weighted values.
fn pv16(am: mat4x4<f32>, corr: f32, pr: vec4<f32>, mi: u32, g: u32) -> mat4x4<f32> {
    let x = 16u * mi;
    return mat4x4<f32>(pv4(am[0], corr, pr, x, g), pv4(am[1], corr, pr, x + 4u, g),
                       pv4(am[2], corr, pr, x + 8u, g), pv4(am[3], corr, pr, x + 12u, g));
}

// ---- query rows and the merge -----------------------------------------------------------------------

fn q_at(base: u32, d: u32) -> f32 {
    if (d < HEAD_DIM) { return q[base + d]; }
    return 0.0;
}

fn q4(base: u32, d: u32) -> vec4<f32> {
    return vec4<f32>(q_at(base, d), q_at(base, d + 1u), q_at(base, d + 2u), q_at(base, d + 3u));
}

fn q16(base: u32, mi: u32, scale: f32) -> mat4x4<f32> {
    let d = 16u * mi;
    return mat4x4<f32>(q4(base, d), q4(base, d + 4u), q4(base, d + 8u), q4(base, d + 12u)) * scale;
}

// Sum the weighted accumulator block am (dims 16 mi ..) over the LANES lanes of each row and write it.
// Column c of the block is summed by lane c (lanes c, c + LANES, ... when LANES < 4).
fn merge16(am: mat4x4<f32>, mi: u32, t: u32, ln: u32, r: u32, writes: bool, obase: u32) {
    workgroupBarrier();                          // earlier readers of sh are done
    sh[t] = am[0];
    sh[t + THREADS] = am[1];
    sh[t + 2u * THREADS] = am[2];
    sh[t + 3u * THREADS] = am[3];
    workgroupBarrier();
    for (var c = ln; c < 4u; c += LANES) {
        var sum = vec4<f32>(0.0);
        for (var x = 0u; x < LANES; x++) { sum += sh[c * THREADS + x * rows() + r]; }
        let d = 16u * mi + 4u * c;
        if (writes && d < HEAD_DIM) {
            out[obase + d] = sum.x;
            if (d + 1u < HEAD_DIM) { out[obase + d + 1u] = sum.y; }
            if (d + 2u < HEAD_DIM) { out[obase + d + 2u] = sum.z; }
            if (d + 3u < HEAD_DIM) { out[obase + d + 3u] = sum.w; }
        }
    }
}

@compute @workgroup_size(THREADS, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let L = p.seq_len;
    let P = HEAD_DIM;
    let n_rows = rows();
    let n_tiles = (L + n_rows - 1u) / n_rows;
    if (wid.x >= n_tiles || wid.y >= p.n_heads || wid.z >= p.batch) { return; }   // uniform per workgroup
    let i0 = (n_tiles - 1u - wid.x) * n_rows;
    let hd = wid.y;
    let row0 = wid.z * L;                        // first row of this batch entry
    let r = t % n_rows;                          // this invocation's row of the tile ...
    let ln = t / n_rows;                         // ... and its lane (a warp holds one lane of 32 rows)
    let i = i0 + r;
    let ii = min(i, L - 1u);                     // rows past L compute row L - 1 and write nothing
    let n_keys = min(i0 + n_rows, L);            // keys any row of the tile can see

    let qbase = (row0 + ii) * p.stride + p.q_off + hd * P;
    let scale = inverseSqrt(f32(P)) * LOG2E;
    let zero = mat4x4<f32>(vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0), vec4<f32>(0.0));
    var q0 = q16(qbase, 0u, scale);
    var q1 = zero;
    var q2 = zero;
    var q3 = zero;
    if (nm() > 1u) { q1 = q16(qbase, 1u, scale); }
    if (nm() > 2u) { q2 = q16(qbase, 2u, scale); }
    if (nm() > 3u) { q3 = q16(qbase, 3u, scale); }
    var a0 = zero;
    var a1 = zero;
    var a2 = zero;
    var a3 = zero;
    var m = NEG;
    var l = 0.0;

    // Tile 0 into registers; each tile is stored, then the next one is fetched while this one is used.
    var kn0 = fetch(false, t, 0u, row0, hd);
    var kn1 = fetch(false, t + THREADS, 0u, row0, hd);
    var vn0 = fetch(true, t, 0u, row0, hd);
    var vn1 = fetch(true, t + THREADS, 0u, row0, hd);
    for (var j0 = 0u; j0 < n_keys; j0 += KEY_TILE) {
        workgroupBarrier();                      // the previous tile is fully read
        stage(t, kn0, vn0);
        stage(t + THREADS, kn1, vn1);
        workgroupBarrier();
        let jn = j0 + KEY_TILE;
        if (jn < n_keys) {
            kn0 = fetch(false, t, jn, row0, hd);
            kn1 = fetch(false, t + THREADS, jn, row0, hd);
            vn0 = fetch(true, t, jn, row0, hd);
            vn1 = fetch(true, t + THREADS, jn, row0, hd);
        }
        for (var g = ln; g < t4(); g += LANES) {
            let kj = j0 + 4u * g;
            if (kj > ii) { break; }              // this and later groups are in the row's future
            var s = qk16(q0, 0u, g);
            if (nm() > 1u) { s += qk16(q1, 1u, g); }
            if (nm() > 2u) { s += qk16(q2, 2u, g); }
            if (nm() > 3u) { s += qk16(q3, 3u, g); }
            // Causal mask (also covers keys past L); key kj itself is visible, so mb is finite.
            s = select(s, vec4<f32>(NEG), vec4<u32>(kj, kj + 1u, kj + 2u, kj + 3u) > vec4<u32>(ii));
            let mb = max(m, max(max(s.x, s.y), max(s.z, s.w)));
            let corr = exp2(m - mb);
            let pr = exp2(s - vec4<f32>(mb));
            l = l * corr + ((pr.x + pr.y) + (pr.z + pr.w));
            a0 = pv16(a0, corr, pr, 0u, g);
            if (nm() > 1u) { a1 = pv16(a1, corr, pr, 1u, g); }
            if (nm() > 2u) { a2 = pv16(a2, corr, pr, 2u, g); }
            if (nm() > 3u) { a3 = pv16(a3, corr, pr, 3u, g); }
            m = mb;
        }
    }

    // Merge the lanes of each row: first (m, l), then the accumulator 16 dims at a time.
    workgroupBarrier();
    sh[t] = vec4<f32>(m, l, 0.0, 0.0);
    workgroupBarrier();
    var mrow = NEG;
    for (var x = 0u; x < LANES; x++) { mrow = max(mrow, sh[x * n_rows + r].x); }
    var lrow = 0.0;
    for (var x = 0u; x < LANES; x++) { lrow += sh[x * n_rows + r].y * exp2(sh[x * n_rows + r].x - mrow); }
    let w = exp2(m - mrow) / lrow;
    let writes = i < L;
    let obase = (row0 + ii) * (p.n_heads * P) + hd * P;
    merge16(a0 * w, 0u, t, ln, r, writes, obase);
    if (nm() > 1u) { merge16(a1 * w, 1u, t, ln, r, writes, obase); }
    if (nm() > 2u) { merge16(a2 * w, 2u, t, ln, r, writes, obase); }
    if (nm() > 3u) { merge16(a3 * w, 3u, t, ln, r, writes, obase); }
}
