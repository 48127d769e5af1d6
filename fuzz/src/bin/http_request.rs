//! AFL harness of the `http_request` target (see `settle_fuzz::http_request`).

fn main() {
    afl::fuzz!(|data: &[u8]| settle_fuzz::http_request(data));
}
