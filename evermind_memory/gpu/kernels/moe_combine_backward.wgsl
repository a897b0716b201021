// moe_combine_backward: gradients of moe_combine.wgsl for one expert, given dout (N, C):
//   dye[r, :]  = gates[r] * dout[rows[r], :]
//   dgates[r]  = sum_c dout[rows[r], c] * ye[r, c]
// One workgroup of 64 threads per dispatched row (fixed-order tree sum). Dispatch: R folded into (x, y).

struct Params { rows: u32, cols: u32, _p0: u32, _p1: u32 };

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> dout: array<f32>;
@group(0) @binding(2) var<storage, read> ye: array<f32>;
@group(0) @binding(3) var<storage, read> rows: array<i32>;
@group(0) @binding(4) var<storage, read> gates: array<f32>;
@group(0) @binding(5) var<storage, read_write> dye: array<f32>;
@group(0) @binding(6) var<storage, read_write> dgates: array<f32>;

var<workgroup> red: array<f32, 64>;

@compute @workgroup_size(64, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let r = wid.x + wid.y * nwg.x;
    if (r >= p.rows) { return; }
    let src = u32(rows[r]) * p.cols;
    let base = r * p.cols;
    let g = gates[r];
    var s = 0.0;
    for (var c = li; c < p.cols; c += 64u) {
        let d = dout[src + c];
        dye[base + c] = g * d;
        s = fma(d, ye[base + c], s);
    }
    red[li] = s;
    workgroupBarrier();
    for (var h = 32u; h > 0u; h >>= 1u) {
        if (li < h) { red[li] += red[li + h]; }
        workgroupBarrier();
    }
    if (li == 0u) { dgates[r] = red[0]; }
}
