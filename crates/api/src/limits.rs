//! Flow control as the API shows it: each concurrency limit's key values now
//! (`GET /v1/limits`), and where one entity stands (`Entity::limits`).

use serde::{Deserialize, Serialize};

/// One key value of a concurrency limit, now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LimitUsage {
    /// The limit.
    pub limit: String,
    /// The key value (empty: the limit has no key).
    pub key: String,
    /// Slots held.
    pub in_use: u64,
    /// How many may be held at once.
    pub max: u64,
    /// Entities waiting in line.
    pub waiting: u64,
}

/// Every concurrency limit's key values with slots in use or work waiting.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct LimitList {
    /// By limit, then key value.
    pub items: Vec<LimitUsage>,
}

/// Where an entity stands with a concurrency limit.
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
    /// How many may be held at once.
    pub max: u64,
    /// The same, for a person: "waiting for `calls` (key eu: 20 of 20 in use, 7th in line)".
    pub says: String,
}

impl EntityLimit {
    /// `limit`, `key`, `place`, `in_use` of `max`, with what it says.
    pub fn new(limit: String, key: String, place: Option<u64>, in_use: u64, max: u64) -> Self {
        let of = if key.is_empty() { String::new() } else { format!("key {key}: ") };
        let says = match place {
            Some(p) => format!("waiting for `{limit}` ({of}{in_use} of {max} in use, {} in line)", ordinal(p)),
            None => format!("holds a slot of `{limit}` ({of}{in_use} of {max} in use)"),
        };
        EntityLimit { limit, key, place, in_use, max, says }
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
            LimitUsage { limit: u.limit.clone(), key: u.key.clone(), in_use: u.in_use, max: u.max, waiting: u.waiting }
        }
    }

    impl From<&settle_store::EntityLimit> for EntityLimit {
        fn from(l: &settle_store::EntityLimit) -> Self {
            EntityLimit::new(l.limit.clone(), l.key.clone(), l.place, l.in_use, l.max)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_entity_says_where_it_stands() {
        let w = EntityLimit::new("provider_calls".into(), "eu".into(), Some(7), 20, 20);
        assert_eq!(w.says, "waiting for `provider_calls` (key eu: 20 of 20 in use, 7th in line)");
        let h = EntityLimit::new("calls".into(), String::new(), None, 1, 4);
        assert_eq!(h.says, "holds a slot of `calls` (1 of 4 in use)");
        let places: Vec<String> = [1, 2, 3, 4, 11, 12, 13, 21, 22, 101, 111].into_iter().map(ordinal).collect();
        assert_eq!(places, ["1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "101st", "111th"]);
    }
}
