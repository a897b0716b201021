// rmsnorm: y[n, c] = x[n, c] * r[n] * weight[c], r[n] = 1 / sqrt(mean_c x[n, c]^2 + eps).
// One workgroup of 64 threads per row (strided over C, then a fixed-order tree sum); also writes r (N,)
// for the backward pass. Dispatch: rows folded into (x, y) groups.

struct Params { rows: u32, dim: u32, eps: f32, _pad: u32 };

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> weight: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<storage, read_write> rinv: array<f32>;

var<workgroup> red: array<f32, 64>;

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) { return; }   // uniform per workgroup, so the barriers below stay uniform
    let base = row * p.dim;
    var s = 0.0;
    for (var c = li; c < p.dim; c += 64u) { let v = x[base + c]; s = fma(v, v, s); }
    red[li] = s;
    workgroupBarrier();
    for (var h = 32u; h > 0u; h >>= 1u) {
        if (li < h) { red[li] += red[li + h]; }
        workgroupBarrier();
    }
    let r = inverseSqrt(red[0] / f32(p.dim) + p.eps);
    for (var c = li; c < p.dim; c += 64u) { y[base + c] = x[base + c] * r * weight[c]; }
    if (li == 0u) { rinv[row] = r; }
}
