//! Enums stored or shown by name, each name written once: `names!` declares the
//! enum with its variants' names and derives `as_str`, `ALL`, `Display` and
//! `FromStr` (a name it does not know is an error that says which).

use std::fmt;

/// A name that no variant of `kind` carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnknownName {
    pub kind: &'static str,
    pub name: String,
    /// The names there are.
    pub known: &'static [&'static str],
}

impl fmt::Display for UnknownName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?} is not one of {}", self.name, self.known.join(", "))
    }
}

impl std::error::Error for UnknownName {}

/// `names! { /// doc  #[derive(..)] pub enum E { /// doc  A = "a", B = "b", } }`
macro_rules! names {
    (
        $(#[$meta:meta])*
        $vis:vis enum $name:ident {
            $($(#[$vmeta:meta])* $variant:ident = $text:literal,)+
        }
    ) => {
        $(#[$meta])*
        $vis enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// Every variant, in declaration order.
            pub const ALL: [$name; [$($text),+].len()] = [$($name::$variant),+];

            /// The name stored in Redis, shown to operators and used as a metric label.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $text,)+
                }
            }
        }

        impl ::std::fmt::Display for $name {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl ::std::str::FromStr for $name {
            type Err = $crate::model::names::UnknownName;

            fn from_str(s: &str) -> Result<$name, Self::Err> {
                match s {
                    $($text => Ok($name::$variant),)+
                    _ => Err($crate::model::names::UnknownName {
                        kind: stringify!($name),
                        name: s.to_string(),
                        known: &[$($text),+],
                    }),
                }
            }
        }
    };
}

pub(crate) use names;

#[cfg(test)]
mod tests {
    names! {
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        enum Colour {
            Red = "red",
            DeepBlue = "deep_blue",
        }
    }

    #[test]
    fn every_name_round_trips_and_an_unknown_one_is_named() {
        for c in Colour::ALL {
            assert_eq!(c.as_str().parse::<Colour>(), Ok(c));
            assert_eq!(c.to_string(), c.as_str());
        }
        let e = "green".parse::<Colour>().unwrap_err();
        // The names there are, not a Rust type's name.
        assert_eq!(e.to_string(), "\"green\" is not one of red, deep_blue");
    }
}
