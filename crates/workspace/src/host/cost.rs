//! Cost estimates: vCPU-hours and GiB-hours of memory for a workspace spec
//! and a duration, priced by a table. The table comes from the optional
//! `config.json` in the state directory (`$MICROAGENT_HOME/config.json`),
//! key `price`; any field left out keeps its default:
//!
//! ```json
//! {"price": {"per_vcpu_hour": 0.04, "per_gib_hour": 0.005, "currency": "USD"}}
//! ```

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use base::code::ErrorCode;
use base::host::settings::ConfigError;
/// The config file's name in the state directory.
pub use base::host::settings::CONFIG_FILE;
/// Default price of one vCPU for one hour.
pub const DEFAULT_PER_VCPU_HOUR: f64 = 0.04;
/// Default price of one GiB of guest memory for one hour.
pub const DEFAULT_PER_GIB_HOUR: f64 = 0.005;
/// Default currency label.
pub const DEFAULT_CURRENCY: &str = "USD";

/// Why the price table could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PriceError {
    /// config.json could not be read, or its `price` is not a price table
    /// (`{"per_vcpu_hour": number, "per_gib_hour": number, "currency":
    /// string}`).
    #[error("reading the price table")]
    Config(#[from] ConfigError),
    /// A price is negative or not a finite number.
    #[error("{} sets {field} to {value}; prices are finite and not negative", path.display())]
    BadPrice {
        /// The config file.
        path: PathBuf,
        /// Which price.
        field: &'static str,
        /// Its value.
        value: f64,
    },
}

impl PriceError {
    /// The stable code.
    pub fn code(&self) -> ErrorCode {
        match self {
            PriceError::Config(ConfigError::Read { .. } | ConfigError::Write { .. }) => {
                ErrorCode::Internal
            }
            PriceError::Config(ConfigError::Parse { .. }) | PriceError::BadPrice { .. } => {
                ErrorCode::InvalidInput
            }
        }
    }
}

/// Prices per unit and hour.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[cfg_attr(feature = "schemars", derive(schemars::JsonSchema))]
#[serde(deny_unknown_fields, default)]
pub struct PriceTable {
    /// Price of one vCPU for one hour.
    pub per_vcpu_hour: f64,
    /// Price of one GiB of guest memory for one hour.
    pub per_gib_hour: f64,
    /// Currency label.
    pub currency: String,
}

impl Default for PriceTable {
    fn default() -> Self {
        Self {
            per_vcpu_hour: DEFAULT_PER_VCPU_HOUR,
            per_gib_hour: DEFAULT_PER_GIB_HOUR,
            currency: DEFAULT_CURRENCY.into(),
        }
    }
}

/// The key of the price table in config.json.
const PRICE_KEY: &str = "price";

/// The price table of the state directory `root`, and where it came from
/// (the file, or `None` for the defaults).
pub fn load(root: &Path) -> Result<(PriceTable, Option<PathBuf>), PriceError> {
    let Some((table, path)) = base::host::settings::config_section::<PriceTable>(root, PRICE_KEY)?
    else {
        return Ok((PriceTable::default(), None));
    };
    for (field, value) in [
        ("per_vcpu_hour", table.per_vcpu_hour),
        ("per_gib_hour", table.per_gib_hour),
    ] {
        if !value.is_finite() || value < 0.0 {
            return Err(PriceError::BadPrice { path, field, value });
        }
    }
    Ok((table, Some(path)))
}

/// Resource use and its price.
#[derive(Clone, Debug, PartialEq)]
pub struct Estimate {
    /// vCPUs times hours times count.
    pub vcpu_hours: f64,
    /// GiB of memory times hours times count.
    pub gib_hours: f64,
    /// Price of the vCPU-hours.
    pub vcpu_cost: f64,
    /// Price of the GiB-hours.
    pub memory_cost: f64,
    /// Their sum.
    pub total: f64,
}

/// Prices `count` workspaces of `vcpus` and `mem_mib` running `secs` seconds.
pub fn estimate(table: &PriceTable, vcpus: u64, mem_mib: u64, secs: u64, count: u64) -> Estimate {
    let hours = secs as f64 / 3600.0 * count as f64;
    let vcpu_hours = vcpus as f64 * hours;
    let gib_hours = mem_mib as f64 / 1024.0 * hours;
    let vcpu_cost = vcpu_hours * table.per_vcpu_hour;
    let memory_cost = gib_hours * table.per_gib_hour;
    Estimate {
        vcpu_hours,
        gib_hours,
        vcpu_cost,
        memory_cost,
        total: vcpu_cost + memory_cost,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn temp(test: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("mcp-cost-{}-{test}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn defaults_without_a_file_and_overrides_with_one() {
        let dir = temp("load");
        assert_eq!(load(&dir).unwrap(), (PriceTable::default(), None));
        std::fs::write(dir.join(CONFIG_FILE), r#"{"other": 1}"#).unwrap();
        assert_eq!(load(&dir).unwrap().0, PriceTable::default());
        std::fs::write(
            dir.join(CONFIG_FILE),
            r#"{"price": {"per_vcpu_hour": 0.1}}"#,
        )
        .unwrap();
        let (table, source) = load(&dir).unwrap();
        assert_eq!(table.per_vcpu_hour, 0.1);
        assert_eq!(table.per_gib_hour, DEFAULT_PER_GIB_HOUR);
        assert_eq!(source, Some(dir.join(CONFIG_FILE)));
        std::fs::write(dir.join(CONFIG_FILE), r#"{"price": {"per_cpu": 1}}"#).unwrap();
        assert_eq!(load(&dir).unwrap_err().code(), ErrorCode::InvalidInput);
        std::fs::write(dir.join(CONFIG_FILE), r#"{"price": {"per_gib_hour": -1}}"#).unwrap();
        let err = load(&dir).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidInput);
        assert!(err.to_string().contains("per_gib_hour"));
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn hours_and_prices_add_up() {
        let e = estimate(&PriceTable::default(), 2, 2048, 1800, 3);
        assert!((e.vcpu_hours - 3.0).abs() < 1e-9);
        assert!((e.gib_hours - 3.0).abs() < 1e-9);
        assert!((e.vcpu_cost - 0.12).abs() < 1e-9);
        assert!((e.memory_cost - 0.015).abs() < 1e-9);
        assert!((e.total - 0.135).abs() < 1e-9);
    }
}
