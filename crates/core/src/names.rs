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
