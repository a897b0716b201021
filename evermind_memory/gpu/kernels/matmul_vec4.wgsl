// matmul_vec4: C (M, N) = op(A) @ op(B) [+ bias] [+ C], the fast path for M, N, K all multiples of 4.
// Same maths and transposes as matmul.wgsl (its numpy twin is the same). Every operand is read and written
// as vec4<f32>. 128x128 output tile per workgroup, K in steps of 8; each of the 16x16 threads owns an 8x8
// block (rows ty*4+0..3 and 64+ty*4+0..3, columns tx*4+0..3 and 64+tx*4+0..3: conflict-free vec4 reads of
// the shared tiles, coalesced writes). The next K-step's global loads are issued before the current
// step's arithmetic (register prefetch). Dispatch: (ceil(N / 128), ceil(M / 128), 1).

override TRANS_A: bool = false;
override TRANS_B: bool = false;
override HAS_BIAS: bool = false;
override ACCUMULATE: bool = false;

struct Dims { M: u32, N: u32, K: u32, _pad: u32 };

@group(0) @binding(0) var<uniform> dims: Dims;
@group(0) @binding(1) var<storage, read> A: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> B: array<vec4<f32>>;
@group(0) @binding(3) var<storage, read> bias: array<vec4<f32>>;
@group(0) @binding(4) var<storage, read_write> C: array<vec4<f32>>;

var<workgroup> As: array<vec4<f32>, 256>;   // [8 k][32 vec4 of m]
var<workgroup> Bs: array<vec4<f32>, 256>;   // [8 k][32 vec4 of n]

// Thread t's share of a K-step tile of A: one vec4, returned with the place it goes.
fn fetch_a(m0: u32, k0: u32, t: u32) -> vec4<f32> {
    if (TRANS_A) {
        // A stored (K, M): 8 rows of k x 32 vec4 of m.
        let k = k0 + t / 32u;
        let mq = m0 / 4u + t % 32u;
        if (k < dims.K && mq * 4u < dims.M) { return A[k * (dims.M / 4u) + mq]; }
        return vec4<f32>(0.0);
    }
    // A stored (M, K): 128 rows of m x 2 vec4 of k.
    let m = m0 + t / 2u;
    let kq = k0 / 4u + t % 2u;
    if (m < dims.M && kq * 4u < dims.K) { return A[m * (dims.K / 4u) + kq]; }
    return vec4<f32>(0.0);
}

fn fetch_b(n0: u32, k0: u32, t: u32) -> vec4<f32> {
    if (TRANS_B) {
        // B stored (N, K): 128 rows of n x 2 vec4 of k.
        let n = n0 + t / 2u;
        let kq = k0 / 4u + t % 2u;
        if (n < dims.N && kq * 4u < dims.K) { return B[n * (dims.K / 4u) + kq]; }
        return vec4<f32>(0.0);
    }
    // B stored (K, N): 8 rows of k x 32 vec4 of n.
    let k = k0 + t / 32u;
    let nq = n0 / 4u + t % 32u;
    if (k < dims.K && nq * 4u < dims.N) { return B[k * (dims.N / 4u) + nq]; }
    return vec4<f32>(0.0);
}

fn stash_a(v: vec4<f32>, t: u32) {
    if (TRANS_A) { As[t] = v; return; }
    // v holds 4 consecutive k of one row m: scatter into the k-major tile.
    let r = t / 2u;
    let kb = (t % 2u) * 4u;
    let q = r / 4u;
    let c = r % 4u;
    As[(kb + 0u) * 32u + q][c] = v.x;
    As[(kb + 1u) * 32u + q][c] = v.y;
    As[(kb + 2u) * 32u + q][c] = v.z;
    As[(kb + 3u) * 32u + q][c] = v.w;
}

fn stash_b(v: vec4<f32>, t: u32) {
    if (!TRANS_B) { Bs[t] = v; return; }
    let r = t / 2u;
    let kb = (t % 2u) * 4u;
    let q = r / 4u;
    let c = r % 4u;
    Bs[(kb + 0u) * 32u + q][c] = v.x;
    Bs[(kb + 1u) * 32u + q][c] = v.y;
    Bs[(kb + 2u) * 32u + q][c] = v.z;
    Bs[(kb + 3u) * 32u + q][c] = v.w;
}

fn store_row(m: u32, nq0: u32, lo: vec4<f32>, hi: vec4<f32>) {
    if (m >= dims.M) { return; }
    let nq_row = dims.N / 4u;
    let base = m * nq_row;
    if (nq0 < nq_row) {
        var v = lo;
        if (HAS_BIAS) { v += bias[nq0]; }
        if (ACCUMULATE) { v += C[base + nq0]; }
        C[base + nq0] = v;
    }
    let nq1 = nq0 + 16u;
    if (nq1 < nq_row) {
        var v = hi;
        if (HAS_BIAS) { v += bias[nq1]; }
        if (ACCUMULATE) { v += C[base + nq1]; }
        C[base + nq1] = v;
    }
}

@compute @workgroup_size(16, 16, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
    let m0 = wid.y * 128u;
    let n0 = wid.x * 128u;
    var c00 = vec4<f32>(0.0); var c01 = vec4<f32>(0.0);
    var c10 = vec4<f32>(0.0); var c11 = vec4<f32>(0.0);
    var c20 = vec4<f32>(0.0); var c21 = vec4<f32>(0.0);
    var c30 = vec4<f32>(0.0); var c31 = vec4<f32>(0.0);
    var c40 = vec4<f32>(0.0); var c41 = vec4<f32>(0.0);
    var c50 = vec4<f32>(0.0); var c51 = vec4<f32>(0.0);
    var c60 = vec4<f32>(0.0); var c61 = vec4<f32>(0.0);
    var c70 = vec4<f32>(0.0); var c71 = vec4<f32>(0.0);

    var ra = fetch_a(m0, 0u, t);
    var rb = fetch_b(n0, 0u, t);
    let n_tiles = (dims.K + 7u) / 8u;
    for (var tile = 0u; tile < n_tiles; tile++) {
        stash_a(ra, t);
        stash_b(rb, t);
        workgroupBarrier();
        if (tile + 1u < n_tiles) {
            ra = fetch_a(m0, (tile + 1u) * 8u, t);
            rb = fetch_b(n0, (tile + 1u) * 8u, t);
        }
        for (var k = 0u; k < 8u; k++) {
            let a0 = As[k * 32u + lid.y];
            let a1 = As[k * 32u + 16u + lid.y];
            let b0 = Bs[k * 32u + lid.x];
            let b1 = Bs[k * 32u + 16u + lid.x];
            c00 = fma(vec4<f32>(a0.x), b0, c00);
            c01 = fma(vec4<f32>(a0.x), b1, c01);
            c10 = fma(vec4<f32>(a0.y), b0, c10);
            c11 = fma(vec4<f32>(a0.y), b1, c11);
            c20 = fma(vec4<f32>(a0.z), b0, c20);
            c21 = fma(vec4<f32>(a0.z), b1, c21);
            c30 = fma(vec4<f32>(a0.w), b0, c30);
            c31 = fma(vec4<f32>(a0.w), b1, c31);
            c40 = fma(vec4<f32>(a1.x), b0, c40);
            c41 = fma(vec4<f32>(a1.x), b1, c41);
            c50 = fma(vec4<f32>(a1.y), b0, c50);
            c51 = fma(vec4<f32>(a1.y), b1, c51);
            c60 = fma(vec4<f32>(a1.z), b0, c60);
            c61 = fma(vec4<f32>(a1.z), b1, c61);
            c70 = fma(vec4<f32>(a1.w), b0, c70);
            c71 = fma(vec4<f32>(a1.w), b1, c71);
        }
        workgroupBarrier();
    }

    let nq0 = n0 / 4u + lid.x;
    store_row(m0 + lid.y * 4u + 0u, nq0, c00, c01);
    store_row(m0 + lid.y * 4u + 1u, nq0, c10, c11);
    store_row(m0 + lid.y * 4u + 2u, nq0, c20, c21);
    store_row(m0 + lid.y * 4u + 3u, nq0, c30, c31);
    store_row(m0 + 64u + lid.y * 4u + 0u, nq0, c40, c41);
    store_row(m0 + 64u + lid.y * 4u + 1u, nq0, c50, c51);
    store_row(m0 + 64u + lid.y * 4u + 2u, nq0, c60, c61);
    store_row(m0 + 64u + lid.y * 4u + 3u, nq0, c70, c71);
}
