//! `flag_enum!`: an enum whose values are named on the command line, in config files and in
//! checkpoints, parsed once at the edge (`FromStr`, with a one-line error that names the flag),
//! written back by the same names (`Display`, and serde through them).

/// `flag_enum! { /// doc \n pub enum Amp("invalid --amp") { Auto = "auto", Off = "off" } }`: the
/// literal begins the error for an unknown name, "invalid --amp 'x' (expected one of: auto | off)".
#[macro_export]
macro_rules! flag_enum {
    ($(#[$meta:meta])* pub enum $name:ident($error:literal) { $($(#[$vmeta:meta])* $variant:ident = $text:literal),+ $(,)? }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, serde_with::SerializeDisplay, serde_with::DeserializeFromStr)]
        pub enum $name {
            $($(#[$vmeta])* $variant),+
        }

        impl $name {
            pub const ALL: &'static [$name] = &[$($name::$variant),+];

            pub fn name(self) -> &'static str {
                match self {
                    $($name::$variant => $text),+
                }
            }

            /// Every name, for help texts and errors.
            pub fn names() -> String {
                Self::ALL.iter().map(|v| v.name()).collect::<Vec<_>>().join(" | ")
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.name())
            }
        }

        impl std::str::FromStr for $name {
            type Err = $crate::error::UserError;

            fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
                Self::ALL.iter().copied().find(|v| v.name() == s).ok_or_else(|| {
                    $crate::error::UserError(format!("{} '{s}' (expected one of: {})", $error, Self::names()))
                })
            }
        }
    };
}
