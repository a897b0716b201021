// attention_values: out[b, i, h, :] = sum over j <= i of probs[bh, r, j] v[b, j, h, :] for the query rows
// i = row0 + r of a window (probs from attention_softmax; masked columns are skipped, never read).
// v and out are (B, L, H * P). 16 rows x 16 head dims per workgroup, keys in steps of 16 through
// workgroup memory, stopping at the tile's last query. Dispatch: (ceil(P / 16), ceil(rows / 16), B * H).

struct Params { seq_len: u32, n_heads: u32, d_head: u32, row0: u32, rows: u32, batch: u32, _p0: u32, _p1: u32 };

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(3) var<storage, read> probs: array<f32>;          // (B * H, rows, L)
@group(0) @binding(4) var<storage, read> v: array<f32>;              // (B, L, H * P)
@group(0) @binding(5) var<storage, read_write> out: array<f32>;      // (B, L, H * P)

var<workgroup> ps: array<f32, 256>;   // [row][key]
var<workgroup> vs: array<f32, 256>;   // [key][dim]

@compute @workgroup_size(16, 16, 1)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let L = p.seq_len;
    let H = p.n_heads;
    let P = p.d_head;
    let C = H * P;
    let e0 = wid.x * 16u;
    let r0 = wid.y * 16u;
    let bh = wid.z;
    if (r0 >= p.rows || bh >= p.batch * H) { return; }
    let i_last = p.row0 + min(r0 + 16u, p.rows) - 1u;
    let b = bh / H;
    let hd = bh % H;
    let r = r0 + lid.y;
    let i = p.row0 + r;
    let e = e0 + lid.x;
    var acc = 0.0;
    for (var j0 = 0u; j0 <= i_last; j0 += 16u) {
        var pv = 0.0;
        if (r < p.rows && j0 + lid.x <= i) { pv = probs[(bh * p.rows + r) * L + j0 + lid.x]; }
        var vv = 0.0;
        let jv = j0 + lid.y;
        if (jv < L && e < P) { vv = v[(b * L + jv) * C + hd * P + e]; }
        ps[lid.y * 16u + lid.x] = pv;
        vs[lid.y * 16u + lid.x] = vv;
        workgroupBarrier();
        for (var jj = 0u; jj < 16u; jj++) {
            acc = fma(ps[lid.y * 16u + jj], vs[jj * 16u + lid.x], acc);
        }
        workgroupBarrier();
    }
    if (r < p.rows && e < P) {
        out[(b * L + i) * C + hd * P + e] = acc;
    }
}
