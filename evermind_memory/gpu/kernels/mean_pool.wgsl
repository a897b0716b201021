// mean_pool: the embedding of each sequence: the mean of x over its real positions, L2-normalised
// (an exactly zero mean stays zero: the norm is floored at 1e-12, as in lm/model.py).
//   pooled[b, c] = sum_{t < len_b} x[b, t, c] / len_b;   out[b] = pooled[b] / max(|pooled[b]|, 1e-12)
// x is (B, T, C) row-major. One workgroup of 64 per sequence (fixed-order sums). Dispatch: B groups, folded.

struct Params { batch: u32, seq: u32, channels: u32, _p0: u32 };

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> lengths: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

var<workgroup> red: array<f32, 64>;

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let b = wid.x + wid.y * nwg.x;
    if (b >= p.batch) { return; }   // uniform per workgroup
    let C = p.channels;
    let len = min(lengths[b], p.seq);
    let inv_len = 1.0 / f32(len);
    var ss = 0.0;
    for (var c = li; c < C; c += 64u) {
        var s = 0.0;
        for (var t = 0u; t < len; t++) { s += x[(b * p.seq + t) * C + c]; }
        let m = s * inv_len;
        out[b * C + c] = m;
        ss = fma(m, m, ss);
    }
    red[li] = ss;
    workgroupBarrier();
    for (var h = 32u; h > 0u; h >>= 1u) {
        if (li < h) { red[li] += red[li + h]; }
        workgroupBarrier();
    }
    let scale = 1.0 / max(sqrt(red[0]), 1e-12);
    for (var c = li; c < C; c += 64u) { out[b * C + c] = out[b * C + c] * scale; }
}
