// attention_scores: causal scores s[bh, r, j] = q_i . k_j / sqrt(P) for query rows i = row0 + r of a window
// (r < rows) and keys j <= i; entries with j > i are left unwritten (attention_softmax never reads them).
// q, k are (B, L, H * P) (heads side by side in each row). 16x16 output tile per workgroup, P in steps of
// 16 through workgroup memory; tiles wholly above the diagonal return at once.
// Dispatch: (ceil(L / 16), ceil(rows / 16), B * H).

struct Params { seq_len: u32, n_heads: u32, d_head: u32, row0: u32, rows: u32, batch: u32, _p0: u32, _p1: u32 };

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> q: array<f32>;              // (B, L, H * P)
@group(0) @binding(2) var<storage, read> k: array<f32>;              // (B, L, H * P)
@group(0) @binding(3) var<storage, read_write> scores: array<f32>;   // (B * H, rows, L)

var<workgroup> qs: array<f32, 256>;   // [row][dim]
var<workgroup> ks: array<f32, 256>;   // [key][dim]

@compute @workgroup_size(16, 16, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let L = p.seq_len;
    let H = p.n_heads;
    let P = p.d_head;
    let C = H * P;
    let j0 = wid.x * 16u;
    let r0 = wid.y * 16u;
    let bh = wid.z;
    if (r0 >= p.rows || bh >= p.batch * H) { return; }
    let i_last = p.row0 + min(r0 + 16u, p.rows) - 1u;
    if (j0 > i_last) { return; }                 // the whole tile is masked: uniform per workgroup
    let b = bh / H;
    let hd = bh % H;
    let r = r0 + lid.y;
    let i = p.row0 + r;
    let j = j0 + lid.x;
    let jk = j0 + lid.y;                         // the key this lane loads
    var acc = 0.0;
    for (var e0 = 0u; e0 < P; e0 += 16u) {
        let e = e0 + lid.x;
        var qv = 0.0;
        if (r < p.rows && e < P) { qv = q[(b * L + i) * C + hd * P + e]; }
        var kv = 0.0;
        if (jk < L && e < P) { kv = k[(b * L + jk) * C + hd * P + e]; }
        qs[lid.y * 16u + lid.x] = qv;
        ks[lid.y * 16u + lid.x] = kv;
        workgroupBarrier();
        for (var ee = 0u; ee < 16u; ee++) {
            acc = fma(qs[lid.y * 16u + ee], ks[lid.x * 16u + ee], acc);
        }
        workgroupBarrier();
    }
    if (r < p.rows && j <= i) {
        scores[(bh * p.rows + r) * L + j] = acc * inverseSqrt(f32(P));
    }
}
