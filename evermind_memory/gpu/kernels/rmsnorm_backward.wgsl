// rmsnorm_backward: gradients of rmsnorm.wgsl, with g = dy * weight and r = 1 / sqrt(mean(x^2) + eps):
//   dx[n, c]  = r * g[n, c] - r^3 * x[n, c] * mean_c(g[n, c] * x[n, c])   (entry `dx_main`, a workgroup a row;
//               it recomputes r and stores it in rinv)
//   dweight[c] = sum_n dy[n, c] * x[n, c] * r[n]                          (entry `dw_main`, a thread a column,
//               fixed summation order; ACCUMULATE adds to dweight for row-tiled work)
// Dispatch: dx_main rows folded into (x, y) groups; dw_main (ceil(C / 64), 1, 1).

override ACCUMULATE: bool = false;

struct Params { rows: u32, dim: u32, eps: f32, _pad: u32 };

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> weight: array<f32>;
@group(0) @binding(3) var<storage, read> dy: array<f32>;
@group(0) @binding(4) var<storage, read_write> dx: array<f32>;
@group(0) @binding(5) var<storage, read_write> rinv: array<f32>;
@group(0) @binding(6) var<storage, read_write> dweight: array<f32>;

var<workgroup> red_ss: array<f32, 64>;
var<workgroup> red_gx: array<f32, 64>;

@compute @workgroup_size(64, 1, 1)
fn dx_main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) li: u32) {
    let row = wid.x + wid.y * nwg.x;
    if (row >= p.rows) { return; }
    let base = row * p.dim;
    var ss = 0.0;
    var gx = 0.0;
    for (var c = li; c < p.dim; c += 64u) {
        let v = x[base + c];
        ss = fma(v, v, ss);
        gx = fma(dy[base + c] * weight[c], v, gx);
    }
    red_ss[li] = ss;
    red_gx[li] = gx;
    workgroupBarrier();
    for (var h = 32u; h > 0u; h >>= 1u) {
        if (li < h) { red_ss[li] += red_ss[li + h]; red_gx[li] += red_gx[li + h]; }
        workgroupBarrier();
    }
    let n = f32(p.dim);
    let r = inverseSqrt(red_ss[0] / n + p.eps);
    let coef = r * r * r * red_gx[0] / n;
    for (var c = li; c < p.dim; c += 64u) {
        dx[base + c] = r * dy[base + c] * weight[c] - coef * x[base + c];
    }
    if (li == 0u) { rinv[row] = r; }
}

@compute @workgroup_size(64, 1, 1)
fn dw_main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let c = gid.x;
    if (c >= p.dim) { return; }
    var s = 0.0;
    for (var n = 0u; n < p.rows; n++) {
        let i = n * p.dim + c;
        s = fma(dy[i] * x[i], rinv[n], s);
    }
    if (ACCUMULATE) { s += dweight[c]; }
    dweight[c] = s;
}
