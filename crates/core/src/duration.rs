//! Human durations as written in machine definitions: `500ms`, `5s`, `10m`, `4h`, `1d`,
//! and sums of them such as `1h30m`.

use std::time::Duration;

/// Parses a duration such as `250ms`, `5s`, `10m`, `1h30m` or `2d`.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(settle_core::duration::parse("1m30s"), Ok(Duration::from_secs(90)));
/// assert!(settle_core::duration::parse("5 parsecs").is_err());
/// ```
pub fn parse(text: &str) -> Result<Duration, String> {
    let s = text.trim();
    if s.is_empty() {
        return Err("empty duration".to_string());
    }
    let bad = || format!("invalid duration `{text}` (expected e.g. `500ms`, `5s`, `10m`, `1h30m`)");
    let mut total: u128 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(bad());
        }
        let n: u128 = rest[..digits].parse().map_err(|_| bad())?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let ms = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            _ => return Err(bad()),
        };
        // Up to 39 digits fit in n: the product, too, may overflow (found by fuzzing).
        total = n.checked_mul(ms).and_then(|x| total.checked_add(x)).ok_or_else(bad)?;
    }
    u64::try_from(total).map(Duration::from_millis).map_err(|_| bad())
}

/// Formats a duration in the shortest form [`parse`] reads back.
pub fn format(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".to_string();
    }
    let mut out = String::new();
    let mut rest = ms;
    for (unit, size) in [("d", 86_400_000u128), ("h", 3_600_000), ("m", 60_000), ("s", 1_000), ("ms", 1)] {
        if rest >= size {
            out.push_str(&format!("{}{unit}", rest / size));
            rest %= size;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn huge_numbers_are_refused_not_wrapped() {
        let e = parse("7777777777777777777777777777777777777d").unwrap_err();
        assert!(e.contains("invalid duration"), "{e}");
        assert!(parse("340282366920938463463374607431768211455ms").is_err(), "u128::MAX ms");
        assert!(parse("18446744073709551616ms").is_err(), "u64::MAX + 1 ms");
        assert_eq!(parse("18446744073709551615ms"), Ok(Duration::from_millis(u64::MAX)));
    }

    #[test]
    fn parses_units_and_sums() {
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse("2d"), Ok(Duration::from_secs(172_800)));
    }

    #[test]
    fn rejects_garbage() {
        for bad in ["", "5", "s", "5x", "1.5s", "-1s", "5 s"] {
            assert!(parse(bad).is_err(), "{bad} should not parse");
        }
    }

    #[test]
    fn format_round_trips() {
        for text in ["0s", "250ms", "10m", "1h30m", "1d2h3m4s5ms"] {
            assert_eq!(format(parse(text).unwrap()), text);
        }
    }
}
