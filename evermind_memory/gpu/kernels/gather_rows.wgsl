// gather_rows: out[n, :] = table[ids[n] - lo, :] for rows whose id lies in [lo, hi); other rows of out are
// left as they are. Embedding lookup, and an expert's dispatch (the rows routed to it), are both this.
// [lo, hi) lets a table larger than one storage binding be gathered in vocabulary tiles.
// Dispatch: 1-D over N * C elements, 256 per group, folded into (x, y) past the per-dimension limit.

struct Params { rows: u32, cols: u32, lo: i32, hi: i32 };

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> table: array<f32>;
@group(0) @binding(2) var<storage, read> ids: array<i32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = (wid.x + wid.y * nwg.x) * 256u + li;
    if (i >= p.rows * p.cols) { return; }
    let n = i / p.cols;
    let c = i % p.cols;
    let id = ids[n];
    if (id < p.lo || id >= p.hi) { return; }
    out[i] = table[u32(id - p.lo) * p.cols + c];
}
