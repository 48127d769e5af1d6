//! Typed names for the things a machine declares and the entities it drives.
//!
//! Names are cheap to clone (`Arc<str>`) because they travel between the pure core,
//! the store and the runtime on every transition.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

macro_rules! name_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub struct $name(Arc<str>);

        impl $name {
            /// Wraps a string as this kind of name.
            pub fn new(s: impl AsRef<str>) -> Self {
                Self(Arc::from(s.as_ref()))
            }
            /// The name as a string slice.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }
        impl Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }
        impl Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }
        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
        impl From<&str> for $name {
            fn from(s: &str) -> Self {
                Self::new(s)
            }
        }
        impl From<String> for $name {
            fn from(s: String) -> Self {
                Self(Arc::from(s))
            }
        }
        impl From<&String> for $name {
            fn from(s: &String) -> Self {
                Self::new(s)
            }
        }
        impl From<Arc<str>> for $name {
            /// Shares the text: no copy.
            fn from(s: Arc<str>) -> Self {
                Self(s)
            }
        }
        impl From<$name> for Arc<str> {
            /// The shared text inside the name: no copy.
            fn from(n: $name) -> Self {
                n.0
            }
        }
        impl From<&$name> for Arc<str> {
            /// The shared text inside the name, one more reference to it: no copy.
            fn from(n: &$name) -> Self {
                Arc::clone(&n.0)
            }
        }
        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                &*self.0 == other
            }
        }
        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                &*self.0 == *other
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&*self.0, f)
            }
        }
    };
}

name_type!(
    /// The name of a machine (an entity type), e.g. `server`.
    MachineName
);
name_type!(
    /// The name of a state within a machine, e.g. `creating`.
    StateName
);
name_type!(
    /// The name of an event within a machine, e.g. `create`.
    EventName
);
name_type!(
    /// The name of an action within a machine, e.g. `create_resources`.
    ActionName
);
name_type!(
    /// The user-chosen key of an entity, unique within its machine.
    EntityKey
);

#[cfg(test)]
mod tests {
    use super::*;

    /// A name and the store's row text share one allocation both ways.
    #[test]
    fn names_and_shared_text_convert_without_a_copy() {
        let text: Arc<str> = Arc::from("creating");
        let name = StateName::from(Arc::clone(&text));
        assert!(Arc::ptr_eq(&text, &Arc::<str>::from(&name)));
        assert!(Arc::ptr_eq(&text, &Arc::<str>::from(name)));
        assert_eq!(MachineName::from(Arc::<str>::from("server")), "server");
    }
}
