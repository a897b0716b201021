// axpy: y[i] += alpha * x[i] over flat float arrays (residual adds in the model and its backward).
// Dispatch: 1-D over n elements, 256 per group, folded into (x, y) past the per-dimension limit.

struct Params { n: u32, alpha: f32, _p0: u32, _p1: u32 };

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = (wid.x + wid.y * nwg.x) * 256u + li;
    if (i >= p.n) { return; }
    y[i] = fma(p.alpha, x[i], y[i]);
}
