// attention_softmax: the causal softmax of one window of score rows, in place: for row (bh, r) with query
// i = row0 + r, s[j] = exp(s[j] - max) / sum over j <= i of exp(s[j] - max); columns j > i are not touched
// (attention_values never reads them). One workgroup of 64 lanes per row, fixed-order tree reductions.
// Dispatch: B * H * rows workgroups, folded into (x, y).

struct Params { seq_len: u32, n_heads: u32, d_head: u32, row0: u32, rows: u32, batch: u32, _p0: u32, _p1: u32 };

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(3) var<storage, read_write> scores: array<f32>;   // (B * H, rows, L)

var<workgroup> red: array<f32, 64>;

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.batch * p.n_heads * p.rows) { return; }   // uniform per workgroup
    let i = p.row0 + row % p.rows;
    let base = row * p.seq_len;
    var mx = -3.4028235e38;
    for (var j = li; j <= i; j += 64u) { mx = max(mx, scores[base + j]); }
    red[li] = mx;
    workgroupBarrier();
    for (var h = 32u; h > 0u; h >>= 1u) {
        if (li < h) { red[li] = max(red[li], red[li + h]); }
        workgroupBarrier();
    }
    let m = red[0];
    workgroupBarrier();
    var s = 0.0;
    for (var j = li; j <= i; j += 64u) { s += exp(scores[base + j] - m); }
    red[li] = s;
    workgroupBarrier();
    for (var h = 32u; h > 0u; h >>= 1u) {
        if (li < h) { red[li] += red[li + h]; }
        workgroupBarrier();
    }
    let inv = 1.0 / red[0];
    for (var j = li; j <= i; j += 64u) { scores[base + j] = exp(scores[base + j] - m) * inv; }
}
