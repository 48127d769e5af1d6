//! Flow control as the API shows it: each limit's key values now (`GET /v1/limits`), and
//! where one entity stands (`Entity::limits`).

use serde::{Deserialize, Serialize};

/// One key value of a limit, now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LimitUsage {
    /// The limit.
    pub limit: String,
    /// The key value (empty: the limit has no key).
    pub key: String,
    /// Slots held (by work started and not yet ended).
    pub in_use: u64,
    /// How many may be held at once; absent for a limit of rate only.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub max: Option<u64>,
    /// Entities waiting in line.
    pub waiting: u64,
    /// A rate's least time between two starts, in microseconds (`per` / `rate`, rounded
    /// up); absent without a rate.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub every_us: Option<u64>,
    /// With a rate: the earliest the next start may be (milliseconds since the epoch; in
    /// the past, one may start now).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub next_start_at: Option<i64>,
}

/// Every limit's key values with slots in use or work waiting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LimitList {
    /// By limit, then key value.
    pub items: Vec<LimitUsage>,
}

/// Where an entity stands with a limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct EntityLimit {
    /// The limit.
    pub limit: String,
    /// The entity's key value.
    pub key: String,
    /// Its place in line, from 1; absent while it holds a slot.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub place: Option<u64>,
    /// Slots of this key value held.
    pub in_use: u64,
    /// How many may be held at once; absent for a limit of rate only.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub max: Option<u64>,
    /// A rate's least time between two starts, in microseconds; absent without a rate.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub every_us: Option<u64>,
    /// The same, for a person: "waiting for `calls` (key eu: 20 of 20 in use, 7th in line)",
    /// with a rate "…; one start every 500 ms)".
    pub says: String,
}

impl EntityLimit {
    /// `limit`, `key`, `place`, `in_use` of `max`, the rate's spacing, with what it says.
    pub fn new(
        limit: String,
        key: String,
        place: Option<u64>,
        in_use: u64,
        max: Option<u64>,
        every_us: Option<u64>,
    ) -> Self {
        let of = if key.is_empty() { String::new() } else { format!("key {key}: ") };
        let used = match max {
            Some(max) => format!("{in_use} of {max} in use"),
            None => format!("{in_use} in use"),
        };
        let rate = every_us.map(|us| format!("; one start every {}", spacing(us))).unwrap_or_default();
        let says = match place {
            Some(p) => format!("waiting for `{limit}` ({of}{used}, {} in line{rate})", ordinal(p)),
            None => format!("holds a slot of `{limit}` ({of}{used}{rate})"),
        };
        EntityLimit { limit, key, place, in_use, max, every_us, says }
    }
}

/// A time between starts for a person: `2 s`, `500 ms`, `8571.429 ms`.
pub fn spacing(us: u64) -> String {
    if us >= 1_000_000 && us.is_multiple_of(1_000_000) {
        format!("{} s", us / 1_000_000)
    } else if us.is_multiple_of(1_000) {
        format!("{} ms", us / 1_000)
    } else {
        let ms = format!("{:.3}", us as f64 / 1_000.0);
        format!("{} ms", ms.trim_end_matches('0'))
    }
}

/// 1st, 2nd, 3rd, 4th, …, 11th, 12th, 13th, 21st, …
fn ordinal(n: u64) -> String {
    let suffix = match (n % 10, n % 100) {
        (_, 11..=13) => "th",
        (1, _) => "st",
        (2, _) => "nd",
        (3, _) => "rd",
        _ => "th",
    };
    format!("{n}{suffix}")
}

#[cfg(feature = "store")]
mod from_store {
    use super::*;

    impl From<&settle_store::LimitUsage> for LimitUsage {
        fn from(u: &settle_store::LimitUsage) -> Self {
            LimitUsage {
                limit: u.limit.clone(),
                key: u.key.clone(),
                in_use: u.in_use,
                max: u.max,
                waiting: u.waiting,
                every_us: u.spacing_us,
                next_start_at: u.next_start_at,
            }
        }
    }

    impl From<&settle_store::EntityLimit> for EntityLimit {
        fn from(l: &settle_store::EntityLimit) -> Self {
            EntityLimit::new(l.limit.clone(), l.key.clone(), l.place, l.in_use, l.max, l.spacing_us)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entity_says_where_it_stands() {
        let w = EntityLimit::new("provider_calls".into(), "eu".into(), Some(7), 20, Some(20), None);
        assert_eq!(w.says, "waiting for `provider_calls` (key eu: 20 of 20 in use, 7th in line)");
        let h = EntityLimit::new("calls".into(), String::new(), None, 1, Some(4), None);
        assert_eq!(h.says, "holds a slot of `calls` (1 of 4 in use)");
        let r = EntityLimit::new("creates".into(), "t1".into(), Some(2), 1, None, Some(500_000));
        assert_eq!(r.says, "waiting for `creates` (key t1: 1 in use, 2nd in line; one start every 500 ms)");
        let spacings: Vec<String> = [2_000_000, 500_000, 8_571_429, 1_500].into_iter().map(spacing).collect();
        assert_eq!(spacings, ["2 s", "500 ms", "8571.429 ms", "1.5 ms"]);
        let places: Vec<String> = [1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111].into_iter().map(ordinal).collect();
        assert_eq!(places, ["1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st", "111th"]);
    }
}
