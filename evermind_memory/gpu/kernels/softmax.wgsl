// softmax: p[n, :] = exp(x[n, :] - max) / sum exp(x[n, :] - max), row by row over x (N, V).
// One workgroup of 256 threads per row: strided max and sum, fixed-order tree reductions.
// Dispatch: rows folded into (x, y) groups.

struct Params { rows: u32, cols: u32, _p0: u32, _p1: u32 };

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;

var<workgroup> red: array<f32, 256>;

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) { return; }
    let base = row * p.cols;
    var mx = -3.4028235e38;
    for (var c = li; c < p.cols; c += 256u) { mx = max(mx, x[base + c]); }
    red[li] = mx;
    workgroupBarrier();
    for (var h = 128u; h > 0u; h >>= 1u) {
        if (li < h) { red[li] = max(red[li], red[li + h]); }
        workgroupBarrier();
    }
    let m = red[0];
    workgroupBarrier();
    var s = 0.0;
    for (var c = li; c < p.cols; c += 256u) { s += exp(x[base + c] - m); }
    red[li] = s;
    workgroupBarrier();
    for (var h = 128u; h > 0u; h >>= 1u) {
        if (li < h) { red[li] += red[li + h]; }
        workgroupBarrier();
    }
    let inv = 1.0 / red[0];
    for (var c = li; c < p.cols; c += 256u) { y[base + c] = exp(x[base + c] - m) * inv; }
}
