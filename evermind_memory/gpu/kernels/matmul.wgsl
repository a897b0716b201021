// matmul: C (M, N) = op(A) @ op(B) [+ bias] [+ C], the general (any shape) path.
// op(A) is (M, K): A is stored (M, K), or (K, M) when TRANS_A. op(B) is (K, N): B is stored (K, N),
// or (N, K) when TRANS_B. Forward linear is (false, false), dX = dY W^T is TRANS_B, dW = X^T dY is TRANS_A.
// 64x64 output tile per workgroup, K in steps of 16, each of the 16x16 threads owns a strided 4x4 block.
// Dispatch: (ceil(N / 64), ceil(M / 64), 1).

override TRANS_A: bool = false;
override TRANS_B: bool = false;
override HAS_BIAS: bool = false;
override ACCUMULATE: bool = false;   // C += op(A) op(B) (K-split tiling)

struct Dims { M: u32, N: u32, K: u32, _pad: u32 };

@group(0) @binding(0) var<uniform> dims: Dims;
@group(0) @binding(1) var<storage, read> A: array<f32>;
@group(0) @binding(2) var<storage, read> B: array<f32>;
@group(0) @binding(3) var<storage, read> bias: array<f32>;
@group(0) @binding(4) var<storage, read_write> C: array<f32>;

const TM: u32 = 64u;
const TN: u32 = 64u;
const TK: u32 = 16u;

var<workgroup> As: array<f32, 1024>;   // [TK][TM]
var<workgroup> Bs: array<f32, 1024>;   // [TK][TN]

fn load_a(m: u32, k: u32) -> f32 {
    if (m >= dims.M || k >= dims.K) { return 0.0; }
    if (TRANS_A) { return A[k * dims.M + m]; }
    return A[m * dims.K + k];
}

fn load_b(k: u32, n: u32) -> f32 {
    if (k >= dims.K || n >= dims.N) { return 0.0; }
    if (TRANS_B) { return B[n * dims.K + k]; }
    return B[k * dims.N + n];
}

fn store_row(m: u32, n0: u32, v: vec4<f32>) {
    if (m >= dims.M) { return; }
    for (var j = 0u; j < 4u; j++) {
        let n = n0 + 16u * j;
        if (n >= dims.N) { continue; }
        var o = v[j];
        if (HAS_BIAS) { o += bias[n]; }
        let idx = m * dims.N + n;
        if (ACCUMULATE) { o += C[idx]; }
        C[idx] = o;
    }
}

@compute @workgroup_size(16, 16, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(local_invocation_index) t: u32) {
    let m0 = wid.y * TM;
    let n0 = wid.x * TN;
    // Row i of the thread's block is c_i; its 4 columns are the vector's components (registers, no arrays).
    var c0 = vec4<f32>(0.0);
    var c1 = vec4<f32>(0.0);
    var c2 = vec4<f32>(0.0);
    var c3 = vec4<f32>(0.0);

    let n_tiles = (dims.K + TK - 1u) / TK;
    for (var tile = 0u; tile < n_tiles; tile++) {
        let k0 = tile * TK;
        for (var r = 0u; r < 4u; r++) {
            let flat = t + r * 256u;
            // Coalesce along the stored inner dimension of each operand.
            var am = flat / TK; var ak = flat % TK;
            if (TRANS_A) { am = flat % TM; ak = flat / TM; }
            As[ak * TM + am] = load_a(m0 + am, k0 + ak);
            var bn = flat % TN; var bk = flat / TN;
            if (TRANS_B) { bn = flat / TK; bk = flat % TK; }
            Bs[bk * TN + bn] = load_b(k0 + bk, n0 + bn);
        }
        workgroupBarrier();
        for (var k = 0u; k < TK; k++) {
            let ar = k * TM + lid.y;
            let br = k * TN + lid.x;
            let b = vec4<f32>(Bs[br], Bs[br + 16u], Bs[br + 32u], Bs[br + 48u]);
            c0 = fma(vec4<f32>(As[ar]), b, c0);
            c1 = fma(vec4<f32>(As[ar + 16u]), b, c1);
            c2 = fma(vec4<f32>(As[ar + 32u]), b, c2);
            c3 = fma(vec4<f32>(As[ar + 48u]), b, c3);
        }
        workgroupBarrier();
    }

    let n_first = n0 + lid.x;
    store_row(m0 + lid.y, n_first, c0);
    store_row(m0 + lid.y + 16u, n_first, c1);
    store_row(m0 + lid.y + 32u, n_first, c2);
    store_row(m0 + lid.y + 48u, n_first, c3);
}
