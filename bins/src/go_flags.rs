//! Go's boolean flag forms, for every `bool` flag of our binaries.
//!
//! vgpu-manager's components parse their flags with Go (pflag, urfave/cli), whose boolean flags take
//! `--flag` (true) or `--flag=VALUE` with `VALUE` one of `strconv.ParseBool`'s twelve spellings
//! (`1 t T TRUE true True`, `0 f F FALSE false False`); `--flag VALUE` with a space does **not** give the
//! flag that value (the flag is true and `VALUE` is a positional argument, which our binaries refuse). Its
//! charts render e.g. `--enable-rbac=false` and `--gds-enabled=false`, so ours take the same forms.
//!
//! Every boolean flag uses this attribute (clap's derive cannot share attributes through a macro, so it is
//! written out the same way on each flag; `default_value` is the flag's default, `"true"` or `"false"`):
//!
//! ```text
//! #[arg(long, num_args = 0..=1, require_equals = true, default_missing_value = "true",
//!       default_value = "false", value_name = "BOOL", value_parser = go_flags::parse_go_bool,
//!       action = clap::ArgAction::Set)]
//! ```
//!
//! A flag that also reads an environment variable (`env = "GDS_ENABLED"`) uses [`parse_go_bool_env`](crate::go_flags::parse_go_bool_env)
//! instead, which takes the same forms plus what vgpu-manager reads from those variables.
//!
//! A refused value exits 2 with clap's message naming the flag, the value and the accepted forms:
//!
//! ```text
//! error: invalid value 'maybe' for '--enable-rbac[=<BOOL>]': "maybe" is not a boolean (expected one of
//! 1, t, T, TRUE, true, True, 0, f, F, FALSE, false, False)
//! ```

/// `strconv.ParseBool`'s spellings, true ones first, in the order Go's documentation lists them.
pub const GO_BOOL_FORMS: [&str; 12] =
    ["1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false", "False"];

/// Parses a boolean flag value exactly as Go's `strconv.ParseBool` does; the error names the value and the
/// accepted forms.
///
/// ```
/// use vgpu_bins::go_flags::parse_go_bool;
///
/// assert_eq!(parse_go_bool("True"), Ok(true));
/// assert_eq!(parse_go_bool("0"), Ok(false));
/// assert!(parse_go_bool("yes").unwrap_err().contains("\"yes\" is not a boolean"));
/// ```
pub fn parse_go_bool(value: &str) -> Result<bool, String> {
    vgpu_gates::parse_bool(value)
        .ok_or_else(|| format!("{value:?} is not a boolean (expected one of {})", GO_BOOL_FORMS.join(", ")))
}

/// [`parse_go_bool`] for a flag that an environment variable also sets (`--gds-enabled` / `GDS_ENABLED`).
///
/// vgpu-manager reads those variables with `util.ValueEnabled`: blanks trimmed, empty = false, `1`, `true`
/// or `enabled` in any case = true. This takes every Go form, and besides, trimmed: empty (false), `true` /
/// `enabled` (true) and `false` / `disabled` (false) in any case. Any other value is refused naming it
/// (vgpu-manager would read it as false without a word).
///
/// ```
/// use vgpu_bins::go_flags::parse_go_bool_env;
///
/// assert_eq!(parse_go_bool_env(" Enabled "), Ok(true));
/// assert_eq!(parse_go_bool_env(""), Ok(false));
/// assert_eq!(parse_go_bool_env("F"), Ok(false));
/// assert!(parse_go_bool_env("on").is_err());
/// ```
pub fn parse_go_bool_env(value: &str) -> Result<bool, String> {
    if let Some(b) = vgpu_gates::parse_bool(value) {
        return Ok(b);
    }
    let trimmed = value.trim();
    if trimmed.is_empty() {
        return Ok(false);
    }
    if let Some(b) = vgpu_gates::parse_bool(trimmed) {
        return Ok(b);
    }
    if trimmed.eq_ignore_ascii_case("true") || trimmed.eq_ignore_ascii_case("enabled") {
        return Ok(true);
    }
    if trimmed.eq_ignore_ascii_case("false") || trimmed.eq_ignore_ascii_case("disabled") {
        return Ok(false);
    }
    Err(format!(
        "{value:?} is not a boolean (expected one of {}, enabled, disabled or empty)",
        GO_BOOL_FORMS.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use proptest::prelude::*;

    use super::*;

    #[test]
    fn the_twelve_go_forms() {
        for (i, form) in GO_BOOL_FORMS.iter().enumerate() {
            assert_eq!(parse_go_bool(form), Ok(i < 6), "{form}");
            assert_eq!(parse_go_bool_env(form), Ok(i < 6), "{form}");
        }
    }

    #[test]
    fn other_values_are_refused_naming_the_value_and_the_forms() {
        for bad in
            ["", " true", "true ", "yes", "no", "on", "off", "tRUE", "FaLsE", "2", "-1", "enabled", "y"]
        {
            let err = parse_go_bool(bad).unwrap_err();
            assert_eq!(
                err,
                format!(
                    "{bad:?} is not a boolean (expected one of 1, t, T, TRUE, true, True, 0, f, F, FALSE, false, False)"
                )
            );
        }
    }

    #[test]
    fn environment_forms() {
        for (value, want) in [
            ("", false),
            ("  ", false),
            (" true ", true),
            ("tRuE", true),
            ("ENABLED", true),
            ("enabled", true),
            ("Disabled", false),
            ("FALSE", false),
            (" 1", true),
            ("0 ", false),
        ] {
            assert_eq!(parse_go_bool_env(value), Ok(want), "{value:?}");
        }
        for bad in ["yes", "on", "2", "enable"] {
            let err = parse_go_bool_env(bad).unwrap_err();
            assert!(err.starts_with(&format!("{bad:?} is not a boolean")), "{err}");
            assert!(err.contains("enabled, disabled or empty"), "{err}");
        }
    }

    proptest! {
        /// Exactly the twelve forms parse; everything else is refused with a message naming it.
        #[test]
        fn only_the_go_forms_parse(value in prop_oneof![
            prop::sample::select(GO_BOOL_FORMS.to_vec()).prop_map(str::to_owned),
            "[01tTfFrueRUEalsALS ]{0,6}",
            any::<String>(),
        ]) {
            match GO_BOOL_FORMS.iter().position(|f| *f == value) {
                Some(i) => prop_assert_eq!(parse_go_bool(&value), Ok(i < 6)),
                None => {
                    let err = parse_go_bool(&value).unwrap_err();
                    prop_assert!(err.starts_with(&format!("{value:?} is not a boolean")), "{}", err);
                    prop_assert!(err.contains("1, t, T, TRUE, true, True, 0, f, F, FALSE, false, False"), "{}", err);
                }
            }
        }

        /// The environment parser agrees with the flag parser wherever the flag parser accepts.
        #[test]
        fn env_parser_extends_the_flag_parser(value in any::<String>()) {
            if let Ok(b) = parse_go_bool(&value) {
                prop_assert_eq!(parse_go_bool_env(&value), Ok(b));
            }
        }
    }
}
