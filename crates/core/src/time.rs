//! Times in requests: RFC 3339 instants or durations from now, as epoch milliseconds.
//! Shared by the HTTP API (`sleep`'s `until`) and the CLI (`settle sleep --until`), which
//! both sit above this crate.

/// Days since 1970-01-01 of a civil date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

fn days_in_month(y: i64, m: i64) -> i64 {
    match m {
        2 if (y % 4 == 0 && y % 100 != 0) || y % 400 == 0 => 29,
        2 => 28,
        4 | 6 | 9 | 11 => 30,
        _ => 31,
    }
}

/// Parses a wake-up time: RFC 3339 (`2026-11-22T10:00:00Z`, optional fraction of a
/// second, `Z` or an offset such as `+02:00`) or a duration from `now` (`+10m`,
/// `+1h30m`), or before it (`-2h`: two hours ago). Epoch ms.
pub fn parse_time(text: &str, now: i64) -> Result<i64, String> {
    let s = text.trim();
    if let Some(rel) = s.strip_prefix('+') {
        let d = crate::duration::parse(rel)?;
        return Ok(now.saturating_add(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)));
    }
    if let Some(rel) = s.strip_prefix('-') {
        let d = crate::duration::parse(rel)?;
        return Ok(now.saturating_sub(i64::try_from(d.as_millis()).unwrap_or(i64::MAX)));
    }
    let bad = || {
        format!("invalid time `{text}` (expected RFC 3339 like `2026-11-22T10:00:00Z`, `+10m` from now or `-2h` ago)")
    };
    let b = s.as_bytes();
    let digits = |range: std::ops::Range<usize>| -> Result<i64, String> {
        let part = s.get(range).ok_or_else(bad)?;
        if part.is_empty() || !part.bytes().all(|c| c.is_ascii_digit()) {
            return Err(bad());
        }
        part.parse().map_err(|_| bad())
    };
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't' | b' ')
        || b[13] != b':'
        || b[16] != b':'
    {
        return Err(bad());
    }
    let (y, mo, d) = (digits(0..4)?, digits(5..7)?, digits(8..10)?);
    let (h, mi, sec) = (digits(11..13)?, digits(14..16)?, digits(17..19)?);
    let mut rest = &s[19..];
    let mut millis = 0;
    if let Some(frac) = rest.strip_prefix('.') {
        let n = frac.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return Err(bad());
        }
        // Milliseconds: the first three digits, the rest truncated.
        let ms: String = frac[..n].chars().chain("000".chars()).take(3).collect();
        millis = ms.parse::<i64>().map_err(|_| bad())?;
        rest = &frac[n..];
    }
    // The offset from UTC, in minutes: `Z` or `±HH:MM`.
    let offset = match rest.as_bytes() {
        [b'Z' | b'z'] => 0,
        [sign @ (b'+' | b'-'), _, _, b':', _, _] => {
            let at = s.len() - rest.len();
            let (oh, om) = (digits(at + 1..at + 3)?, digits(at + 4..at + 6)?);
            if oh > 23 || om > 59 {
                return Err(format!("time `{text}` has an offset out of range"));
            }
            let minutes = oh * 60 + om;
            if *sign == b'-' { -minutes } else { minutes }
        }
        _ => return Err(bad()),
    };
    if !(1..=12).contains(&mo) || d < 1 || d > days_in_month(y, mo) || h > 23 || mi > 59 || sec > 59 {
        return Err(format!("time `{text}` is out of range"));
    }
    Ok((days_from_civil(y, mo, d) * 86_400 + h * 3600 + mi * 60 + sec - offset * 60) * 1000 + millis)
}

/// Epoch ms as RFC 3339 in UTC with milliseconds (`2026-11-22T10:00:00.000Z`): what
/// [`parse_time`] reads back.
pub fn format_time(ms: i64) -> String {
    let (days, in_day) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    // Civil date of a day count (the inverse of `days_from_civil`).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    let (h, mi, s, milli) = (in_day / 3_600_000, in_day / 60_000 % 60, in_day / 1000 % 60, in_day % 1000);
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{milli:03}Z")
}

#[cfg(test)]
mod tests {
    use super::{format_time, parse_time};

    #[test]
    fn formatted_times_read_back() {
        for ms in [0, 1_795_000_000_123, 1_709_251_199_000, 951_782_400_000, -86_400_001] {
            assert_eq!(parse_time(&format_time(ms), 0), Ok(ms), "{}", format_time(ms));
        }
        assert_eq!(format_time(1_795_341_600_000), "2026-11-22T10:00:00.000Z");
        assert_eq!(format_time(1_709_251_199_000), "2024-02-29T23:59:59.000Z");
    }

    #[test]
    fn parses_rfc3339_utc_and_relative_times() {
        assert_eq!(parse_time("1970-01-01T00:00:00Z", 0), Ok(0));
        assert_eq!(parse_time("2026-11-18T11:06:40.123Z", 0), Ok(1_795_000_000_123));
        assert_eq!(parse_time("2026-11-22T10:00:00Z", 0), Ok(1_795_341_600_000));
        assert_eq!(parse_time("2024-02-29T23:59:59+00:00", 0), Ok(1_709_251_199_000));
        assert_eq!(parse_time("+10m", 1_000), Ok(601_000));
        assert_eq!(parse_time("+1h30m", 0), Ok(5_400_000));
        assert_eq!(parse_time("-2h", 7_200_500), Ok(500));
        assert_eq!(parse_time("2026-11-22T12:00:00+02:00", 0), Ok(1_795_341_600_000));
        assert_eq!(parse_time("2026-11-22T04:30:00-05:30", 0), Ok(1_795_341_600_000));
        assert!(parse_time("2026-11-22T10:00:00+24:00", 0).unwrap_err().contains("offset out of range"));
        assert!(parse_time("2026-11-22T10:00:00+0200", 0).is_err());
        assert!(parse_time("2023-02-29T00:00:00Z", 0).unwrap_err().contains("out of range"));
        assert!(parse_time("2026-11-22", 0).unwrap_err().contains("expected RFC 3339"));
        assert!(parse_time("tomorrow", 0).is_err());
        assert!(parse_time("+soon", 0).is_err());
    }
}
