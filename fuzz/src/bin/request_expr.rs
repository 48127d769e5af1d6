//! AFL harness of the `request_expr` target (see `settle_fuzz::request_expr`).

fn main() {
    afl::fuzz!(|data: &[u8]| settle_fuzz::request_expr(data));
}
