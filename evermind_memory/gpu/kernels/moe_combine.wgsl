// moe_combine: one expert's output added back into the token rows it was dispatched from:
//   out[rows[r], :] += gates[r] * ye[r, :]   for r < R.
// Within one expert each token appears at most once (top-k picks distinct experts), so no two threads
// write one element: no atomics, and the result does not depend on scheduling. Experts are combined one
// dispatch after another. Dispatch: 1-D over R * C, 256 per group, folded into (x, y).

struct Params { rows: u32, cols: u32, _p0: u32, _p1: u32 };

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> ye: array<f32>;
@group(0) @binding(2) var<storage, read> rows: array<i32>;
@group(0) @binding(3) var<storage, read> gates: array<f32>;
@group(0) @binding(4) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = (wid.x + wid.y * nwg.x) * 256u + li;
    if (i >= p.rows * p.cols) { return; }
    let r = i / p.cols;
    let c = i % p.cols;
    let dst = u32(rows[r]) * p.cols + c;
    out[dst] = fma(gates[r], ye[i], out[dst]);
}
