// activation: elementwise ReLU / SiLU / GELU (tanh form) and their backward products.
// ACT picks the function: 0 relu, 1 silu (x * sigmoid(x)), 2 gelu (0.5 x (1 + tanh(sqrt(2/pi)(x + 0.044715 x^3))),
// computed as x * sigmoid(2 sqrt(2/pi)(x + 0.044715 x^3)), the same function).
// Entry `forward`: y = f(x). Entry `backward`: dx = dy * f'(x) (from the saved input x).
// Dispatch: 1-D over the elements, 256 per group, folded into (x, y) past the per-dimension limit.

override ACT: u32 = 0u;

struct Params { n: u32, _p0: u32, _p1: u32, _p2: u32 };

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> x: array<f32>;
@group(0) @binding(2) var<storage, read> dy: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

const GELU_K: f32 = 0.7978845608028654;   // sqrt(2 / pi)
const GELU_A: f32 = 0.044715;

fn sigmoid(v: f32) -> f32 {
    // exp of a non-positive argument only: never overflows.
    if (v >= 0.0) { return 1.0 / (1.0 + exp(-v)); }
    let e = exp(v);
    return e / (1.0 + e);
}

// GELU's tanh form through sigmoid: 0.5 (1 + tanh(u)) = sigmoid(2u) and 1 - tanh(u)^2 = 4 s (1 - s), which
// keeps the saturated tails free of cancellation.
fn f(v: f32) -> f32 {
    if (ACT == 0u) { return max(v, 0.0); }
    if (ACT == 1u) { return v * sigmoid(v); }
    return v * sigmoid(2.0 * GELU_K * (v + GELU_A * v * v * v));
}

fn df(v: f32) -> f32 {
    if (ACT == 0u) { return select(0.0, 1.0, v > 0.0); }
    if (ACT == 1u) { let s = sigmoid(v); return s * (1.0 + v * (1.0 - s)); }
    let u2 = 2.0 * GELU_K * (v + GELU_A * v * v * v);
    let s = sigmoid(u2);
    return s + 2.0 * v * s * sigmoid(-u2) * GELU_K * (1.0 + 3.0 * GELU_A * v * v);
}

@compute @workgroup_size(256, 1, 1)
fn forward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
           @builtin(local_invocation_index) li: u32) {
    let i = (wid.x + wid.y * nwg.x) * 256u + li;
    if (i >= p.n) { return; }
    out[i] = f(x[i]);
}

@compute @workgroup_size(256, 1, 1)
fn backward(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
            @builtin(local_invocation_index) li: u32) {
    let i = (wid.x + wid.y * nwg.x) * 256u + li;
    if (i >= p.n) { return; }
    out[i] = dy[i] * df(x[i]);
}
