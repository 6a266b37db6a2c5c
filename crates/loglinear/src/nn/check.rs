//! What the configs' `validate` return: the field that is out of range and what it must be.

/// A config value out of its range, or values that do not fit together: the field (its path in
/// the config, e.g. `mixer.d_state`) and what is wrong with it. A caller that reads configs from
/// files of its own maps the field to its own key (the CLI reports `model.d_state`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ConfigError {
    /// Path of the field in the config, e.g. `mixer.d_state` or `lambda.levels`.
    pub field: String,
    /// What the value must be, with the value, e.g. `must be at least 1, got 0`.
    pub problem: String,
}

impl ConfigError {
    /// `field` `problem`.
    pub fn new(field: &str, problem: impl Into<String>) -> Self {
        Self {
            field: field.to_string(),
            problem: problem.into(),
        }
    }

    /// The error of a nested config as its parent sees it: `prefix.field`.
    pub fn within(self, prefix: &str) -> Self {
        Self {
            field: format!("{prefix}.{}", self.field),
            ..self
        }
    }
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}", self.field, self.problem)
    }
}

impl std::error::Error for ConfigError {}

/// The first of `sizes` that is 0, as an error.
pub(crate) fn positive(sizes: &[(&str, usize)]) -> Result<(), ConfigError> {
    match sizes.iter().find(|(_, v)| *v == 0) {
        Some((field, v)) => Err(ConfigError::new(
            field,
            format!("must be at least 1, got {v}"),
        )),
        None => Ok(()),
    }
}

/// `value` as the standard deviation of an init: positive and finite.
pub(crate) fn std_dev(field: &str, value: f64) -> Result<(), ConfigError> {
    if value > 0.0 && value.is_finite() {
        Ok(())
    } else {
        Err(ConfigError::new(
            field,
            format!("must be a positive standard deviation, got {value}"),
        ))
    }
}

/// `width` unless it is `Some(0)` (absent means a rule's width).
pub(crate) fn width_when_set(field: &str, width: Option<usize>) -> Result<(), ConfigError> {
    if width == Some(0) {
        Err(ConfigError::new(
            field,
            "must be at least 1 when set, got 0",
        ))
    } else {
        Ok(())
    }
}
