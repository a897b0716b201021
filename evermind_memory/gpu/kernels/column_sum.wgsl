// column_sum: out (N,) = sum over rows of x (M, N), e.g. a bias gradient db = dY.sum(0).
// Each workgroup owns 64 columns; its 4 row lanes stride the rows and are then added in a fixed order,
// so the result is deterministic. ACCUMULATE adds to out (row-tiled work). Dispatch: (ceil(N / 64), 1, 1).

override ACCUMULATE: bool = false;

struct Dims { M: u32, N: u32, _p0: u32, _p1: u32 };

@group(0) @binding(0) var<uniform> dims: Dims;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;

var<workgroup> part: array<f32, 256>;

@compute @workgroup_size(64, 4, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let n = wid.x * 64u + lid.x;
    var s = 0.0;
    if (n < dims.N) {
        for (var m = lid.y; m < dims.M; m += 4u) { s += x[m * dims.N + n]; }
    }
    part[lid.y * 64u + lid.x] = s;
    workgroupBarrier();
    if (lid.y == 0u && n < dims.N) {
        var v = ((part[lid.x] + part[64u + lid.x]) + part[128u + lid.x]) + part[192u + lid.x];
        if (ACCUMULATE) { v += out[n]; }
        out[n] = v;
    }
}
