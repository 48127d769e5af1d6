//! The `request_expr` target: an expression as a request gives it (`where=` of a list, a
//! bulk operation's filter), refused or evaluated, never a crash (a panic, a stack
//! overflow, an allocation that fails) whatever its shape. [`generated`] makes the shapes
//! that once overflowed a thread's stack or exhausted memory (chains thousands long,
//! nested comprehensions, huge literals) and mutations of them, from a seed: the tests run
//! a fixed count of them, as CI does.

use serde_json::Value;

/// Parses the expression with a request's limits and, if it is accepted, evaluates it
/// against fixed properties, in a state and without one.
pub fn request_expr(data: &[u8]) {
    let Ok(source) = std::str::from_utf8(data) else {
        return;
    };
    let guard = match settle_engine::Narrow::parse_expr(source) {
        Ok(guard) => guard,
        Err(message) => {
            assert!(message.starts_with("where: ") && message.len() > 7, "a bare refusal for {source:?}: {message}");
            return;
        }
    };
    let (props, _) = crate::guard_target::default_data();
    drop(guard.eval(&props, &Value::Null, ["a", "b"]));
    drop(guard.eval(&serde_json::Map::new(), &Value::Null, []));
}

/// The `n`th input of the generated run from `seed`: an adversarial shape, or a mutation
/// of one.
pub fn generated(seed: u64, n: u64) -> Vec<u8> {
    let mut r = Rng(seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let atom = |r: &mut Rng| {
        ["props.size", "props.tags", "1", "'x'", "true", "props.nested.b", "[1, 2]", "in_state('a')", "props"]
            [r.below(9) as usize]
            .to_string()
    };
    let len = |r: &mut Rng| match r.below(4) {
        0 => r.below(8),
        1 => r.below(64),
        2 => r.below(600),
        _ => r.below(6000),
    } as usize;
    let list = |n: usize| format!("[{}]", (0..n).map(|i| i.to_string()).collect::<Vec<_>>().join(","));
    let text = match r.below(9) {
        0 => format!("{}{} == 1", atom(&mut r), ".a".repeat(len(&mut r))),
        1 => {
            let op = [" + ", "+", " && ", " || ", " == ", " < ", "-", "*"][r.below(8) as usize];
            let n = len(&mut r).max(1);
            (0..n).map(|_| atom(&mut r)).collect::<Vec<_>>().join(op)
        }
        2 => {
            let d = len(&mut r);
            format!("{}{}{}", "(".repeat(d), atom(&mut r), ")".repeat(d))
        }
        3 => format!("{}true", ["!", "-", "!!"][r.below(3) as usize].repeat(len(&mut r))),
        4 => format!("props.size in {}", list(len(&mut r))),
        5 => {
            let (depth, l) = (1 + r.below(6) as usize, list(r.below(120) as usize));
            let macro_ = ["all", "exists", "exists_one", "map", "filter"][r.below(5) as usize];
            let mut e = "x0 >= 0".to_string();
            for i in (0..depth).rev() {
                e = format!("{l}.{macro_}(x{i}, {e})");
            }
            if macro_ == "map" || macro_ == "filter" { format!("size({e}) > 0") } else { e }
        }
        6 => format!("{}{}{}", "[".repeat(len(&mut r)), atom(&mut r), "]".repeat(len(&mut r))),
        7 => format!("'{}' == props.name", "\\'(".repeat(len(&mut r))),
        _ => (0..len(&mut r)).map(|_| (b' ' + r.below(95) as u8) as char).collect(),
    };
    let mut bytes = text.into_bytes();
    // A few mutations: a byte changed, removed or repeated.
    for _ in 0..r.below(4) {
        if bytes.is_empty() {
            break;
        }
        let at = r.below(bytes.len() as u64) as usize;
        match r.below(3) {
            0 => {
                const SOME: &[u8] = b"()[]{}.,+!'\"\\ ax1";
                bytes[at] = SOME[r.below(SOME.len() as u64) as usize];
            }
            1 => drop(bytes.remove(at)),
            _ => {
                let b = bytes[at];
                bytes.splice(at..at, std::iter::repeat_n(b, r.below(200) as usize));
            }
        }
    }
    bytes
}

/// xorshift64: a fixed sequence per seed, no dependency.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        if n == 0 { 0 } else { self.0 % n }
    }
}
