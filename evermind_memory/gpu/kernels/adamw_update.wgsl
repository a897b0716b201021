// adamw_update: one fused AdamW step over a flat parameter tensor, in place; the WGSL original of the numpy
// `adamw_update_` in training/optim.py, with the same float32 maths:
//   g = grad * grad_scale;  m' = b1 m + (1 - b1) g;  v' = b2 v + (1 - b2) g^2
//   step = lr * (m' / (1 - b1^t)) / (sqrt(v' / (1 - b2^t)) + eps)
//   step = clamp(step, -max_delta, max_delta) when max_delta > 0     (trust region)
//   param = param * (1 - lr * weight_decay) - step                     (decoupled decay)
// NaN guard: entry `check` raises flag[0] if any v' or step of the tensor is not finite; entry `apply` then
// leaves param, m and v untouched (the whole step is dropped, so one bad gradient never poisons a weight).
// Run `check` over every tile of a tensor before `apply`. Dispatch: 1-D over elements, 256 per group, folded.

struct AdamParams {
    n: u32, lr: f32, beta1: f32, beta2: f32,
    eps: f32, weight_decay: f32, beta1_t: f32, beta2_t: f32,
    max_delta: f32, grad_scale: f32, _p0: f32, _p1: f32,
};

@group(0) @binding(0) var<uniform> a: AdamParams;
@group(0) @binding(1) var<storage, read_write> param: array<f32>;
@group(0) @binding(2) var<storage, read> grad: array<f32>;
@group(0) @binding(3) var<storage, read_write> m_state: array<f32>;
@group(0) @binding(4) var<storage, read_write> v_state: array<f32>;
@group(0) @binding(5) var<storage, read_write> flag: array<atomic<u32>>;

struct Moments { m: f32, v: f32, step: f32 };

fn finite(x: f32) -> bool {
    // NaN fails x == x; +-Inf exceed the largest finite f32.
    return x == x && abs(x) <= 3.4028235e38;
}

fn moments(i: u32) -> Moments {
    let g = grad[i] * a.grad_scale;
    let m = a.beta1 * m_state[i] + (1.0 - a.beta1) * g;
    let v = a.beta2 * v_state[i] + (1.0 - a.beta2) * g * g;
    let step = a.lr * (m / (1.0 - a.beta1_t)) / (sqrt(v / (1.0 - a.beta2_t)) + a.eps);
    return Moments(m, v, step);
}

@compute @workgroup_size(256, 1, 1)
fn check(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) li: u32) {
    let i = (wid.x + wid.y * nwg.x) * 256u + li;
    if (i >= a.n) { return; }
    let r = moments(i);
    if (!finite(r.v) || !finite(r.step)) { atomicOr(&flag[0], 1u); }
}

@compute @workgroup_size(256, 1, 1)
fn apply(@builtin(workgroup_id) wid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>,
         @builtin(local_invocation_index) li: u32) {
    let i = (wid.x + wid.y * nwg.x) * 256u + li;
    if (i >= a.n || atomicLoad(&flag[0]) != 0u) { return; }
    let r = moments(i);
    var step = r.step;
    if (a.max_delta > 0.0) { step = clamp(step, -a.max_delta, a.max_delta); }
    m_state[i] = r.m;
    v_state[i] = r.v;
    param[i] = param[i] * (1.0 - a.lr * a.weight_decay) - step;
}
