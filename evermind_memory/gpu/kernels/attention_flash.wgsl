// attention_flash: causal multi-head softmax attention in one pass (flash-attention style), never forming
// the L x L scores: out[b, i, h, :] = sum over j <= i of softmax_j(q_i . k_j / sqrt(P)) v[b, j, h, :].
//
// One workgroup of 64 invocations per (query tile of 64 rows, head, batch row); invocation t owns query row
// i = i0 + t: its scaled query and its output accumulator stay in registers. Keys and values pass through
// workgroup memory KEY_TILE rows at a time (coalesced loads shared by all 64 rows); tiles wholly above the
// diagonal are never loaded. Each row keeps a running max m and sum l (online softmax): per step of 16 keys
// the 16 scores are formed, m moves to the new max, l and the accumulator are rescaled by exp(m_old - m_new)
// once, and the 16 probability-weighted value rows are added. exp is exp2 with log2(e) folded into q.
//
// q, k, v are rows of `stride` floats (B * L rows, batch-major); head h of row r is at
// r * stride + {q,k,v}_off + h * P, so a fused (B * L, 3C) projection is read in place (column slices,
// seed-001) and plain (B, L, H * P) tensors use stride = H * P, offsets 0. out is (B, L, H * P) dense.
// HEAD_DIM (P) is a pipeline constant (P <= 4 * MAX_PV4 = 64) so the per-row loops unroll and the row
// stays in registers; KEY_TILE * ceil(P / 4) <= SLOTS and KEY_TILE is a multiple of SUB (the host sizes it).
// Dispatch: (ceil(L / 64), H, B); tiles are taken last-first so the longest rows start earliest.

override HEAD_DIM: u32 = 32u;     // P
override KEY_TILE: u32 = 64u;     // keys staged in workgroup memory per step

const ROWS: u32 = 64u;            // query rows per workgroup = invocations
const SUB: u32 = 16u;             // keys per online-softmax step
const MAX_PV4: u32 = 16u;         // vec4s per head row held in registers: P <= 64
const SLOTS: u32 = 512u;          // vec4s per K or V tile (8 KiB each: both fit the 16 KiB default limit)
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

var<workgroup> ks: array<vec4<f32>, SLOTS>;   // [key][P / 4], padded lanes zero
var<workgroup> vs: array<vec4<f32>, SLOTS>;

fn q_at(base: u32, d: u32) -> f32 {
    if (d < HEAD_DIM) { return q[base + d]; }
    return 0.0;
}

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) t: u32) {
    let L = p.seq_len;
    let P = HEAD_DIM;
    let pv4 = (HEAD_DIM + 3u) / 4u;
    let n_tiles = (L + ROWS - 1u) / ROWS;
    if (wid.x >= n_tiles || wid.y >= p.n_heads || wid.z >= p.batch) { return; }   // uniform per workgroup
    let i0 = (n_tiles - 1u - wid.x) * ROWS;
    let hd = wid.y;
    let row0 = wid.z * L;                        // first row of this batch entry
    let i = i0 + t;
    let ii = min(i, L - 1u);                     // rows past L compute row L - 1 and write nothing
    let n_keys = min(i0 + ROWS, L);              // keys any row of the tile can see

    var qr: array<vec4<f32>, MAX_PV4>;
    var acc: array<vec4<f32>, MAX_PV4>;
    let scale = inverseSqrt(f32(P)) * LOG2E;
    let qbase = (row0 + ii) * p.stride + p.q_off + hd * P;
    for (var e = 0u; e < pv4; e++) {
        let d = e * 4u;
        qr[e] = vec4<f32>(q_at(qbase, d), q_at(qbase, d + 1u), q_at(qbase, d + 2u), q_at(qbase, d + 3u)) * scale;
        acc[e] = vec4<f32>(0.0);
    }
    var m = NEG;
    var l = 0.0;

    let width = pv4 * 4u;                        // padded floats per staged row
    for (var j0 = 0u; j0 < n_keys; j0 += KEY_TILE) {
        workgroupBarrier();                      // the previous tile is fully read
        // Stage keys j0 .. j0 + KEY_TILE - 1 (zeros past L and in the padded lanes): consecutive
        // invocations read consecutive floats of a row.
        for (var f = t; f < KEY_TILE * width; f += ROWS) {
            let r = f / width;
            let c = f % width;
            let j = j0 + r;
            var kv = 0.0;
            var vv = 0.0;
            if (j < L && c < P) {
                let g = (row0 + j) * p.stride + hd * P + c;
                kv = k[g + p.k_off];
                vv = v[g + p.v_off];
            }
            ks[r * pv4 + c / 4u][c % 4u] = kv;
            vs[r * pv4 + c / 4u][c % 4u] = vv;
        }
        workgroupBarrier();

        for (var s0 = 0u; s0 < KEY_TILE; s0 += SUB) {
            let js = j0 + s0;
            if (js > ii) { continue; }           // all 16 keys are in this row's future (or past L)
            var s: array<f32, SUB>;
            for (var jj = 0u; jj < SUB; jj++) { s[jj] = 0.0; }
            for (var e = 0u; e < pv4; e++) {
                let qe = qr[e];
                for (var jj = 0u; jj < SUB; jj++) {
                    s[jj] += dot(qe, ks[(s0 + jj) * pv4 + e]);
                }
            }
            var mb = m;
            for (var jj = 0u; jj < SUB; jj++) {
                if (js + jj > ii) { s[jj] = NEG; }   // causal mask (also covers keys past L)
                mb = max(mb, s[jj]);
            }
            let corr = exp2(m - mb);
            l *= corr;
            for (var e = 0u; e < pv4; e++) { acc[e] *= corr; }
            for (var jj = 0u; jj < SUB; jj++) {
                let pj = exp2(s[jj] - mb);
                l += pj;
                for (var e = 0u; e < pv4; e++) {
                    acc[e] = fma(vec4<f32>(pj), vs[(s0 + jj) * pv4 + e], acc[e]);
                }
            }
            m = mb;
        }
    }

    if (i < L) {
        let inv = 1.0 / l;
        let obase = (row0 + i) * (p.n_heads * P) + hd * P;
        for (var e = 0u; e < pv4; e++) {
            let a = acc[e] * inv;
            let d = e * 4u;
            out[obase + d] = a.x;
            if (d + 1u < P) { out[obase + d + 1u] = a.y; }
            if (d + 2u < P) { out[obase + d + 2u] = a.z; }
            if (d + 3u < P) { out[obase + d + 3u] = a.w; }
        }
    }
}
