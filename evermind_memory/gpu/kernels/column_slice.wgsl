// column_slice: out (M, width) = x[:, start : start + width] for x (M, stride), row-major (seed-001).
// A projection's outputs are column ranges inside every row, so splitting them is a strided gather, not
// a prefix copy (which is only right for M == 1). Dispatch: 1-D over M * width, 256 per group, folded.

struct Params { rows: u32, stride: u32, start: u32, width: u32 };

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = (wid.x + wid.y * nwg.x) * 256u + li;
    if (i >= p.rows * p.width) { return; }
    let m = i / p.width;
    let j = i % p.width;
    out[i] = x[m * p.stride + p.start + j];
}
