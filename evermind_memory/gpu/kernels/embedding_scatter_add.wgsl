// embedding_scatter_add: dtable[v, :] = sum of dy[n, :] over the positions n with ids[n] == v.
// Deterministic, no atomics: the host sorts positions by id (stable), so unique id u owns the positions
// order[offsets[u] .. offsets[u + 1]) and one thread per (u, c) sums them in that fixed order.
// Rows of dtable whose id never occurs are not written (clear them first). `lo` shifts the written row
// (vocabulary tiles): dtable row = uniq[u] - lo. Dispatch: 1-D over U * C, 256 per group, folded.

override ACCUMULATE: bool = false;

struct Params { n_uniq: u32, cols: u32, lo: i32, _pad: u32 };

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> dy: array<f32>;
@group(0) @binding(2) var<storage, read> uniq: array<i32>;
@group(0) @binding(3) var<storage, read> offsets: array<u32>;
@group(0) @binding(4) var<storage, read> order: array<u32>;
@group(0) @binding(5) var<storage, read_write> dtable: array<f32>;

@compute @workgroup_size(256, 1, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
        @builtin(local_invocation_index) li: u32) {
    let i = (wid.x + wid.y * nwg.x) * 256u + li;
    if (i >= p.n_uniq * p.cols) { return; }
    let u = i / p.cols;
    let c = i % p.cols;
    var s = 0.0;
    for (var j = offsets[u]; j < offsets[u + 1u]; j++) {
        s += dy[order[j] * p.cols + c];
    }
    let dst = u32(uniq[u] - p.lo) * p.cols + c;
    if (ACCUMULATE) { s += dtable[dst]; }
    dtable[dst] = s;
}
