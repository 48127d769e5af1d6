//! Lease renewal: an engine extends the leases it still holds on the entities it works on,
//! each due again when its lease would end (so that a crashed holder's entities come back).

use crate::Millis;
use crate::plan::rows::Renewal;

/// Renews the leases `asked` that `owner` still holds (`held`: the entities read with their
/// holder), until `until`. A lease lost meanwhile (taken over after it expired, dropped by a
/// command) is not renewed.
pub(crate) fn renew(asked: &[i64], held: &[(i64, Option<String>)], owner: &str, until: Millis) -> Vec<Renewal> {
    held.iter()
        .filter(|(id, holder)| holder.as_deref() == Some(owner) && asked.contains(id))
        .map(|&(id, _)| Renewal { id, until })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_leases_still_held_by_the_owner_are_renewed() {
        let held = [
            (1, Some("me".to_string())),
            (2, Some("other".to_string())),
            (3, None),
            (4, Some("me".to_string())),
            (5, Some("me".to_string())),
        ];
        let r = renew(&[1, 2, 3, 4], &held, "me", 900);
        assert_eq!(r, vec![Renewal { id: 1, until: 900 }, Renewal { id: 4, until: 900 }], "5 was not asked");
        assert!(renew(&[], &held, "me", 900).is_empty());
    }
}
