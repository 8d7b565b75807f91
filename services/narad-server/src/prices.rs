//! The price table the console prices token usage with
//! (`NARAD_CONSOLE_PRICES`): per model, a price per million of each usage
//! counter, in one currency (`NARAD_CONSOLE_CURRENCY`). narad keeps no
//! prices of its own: providers change them, and only the operator knows
//! what it pays. Served to the console in `/console/config.json`.

use std::collections::BTreeMap;

use serde::Serialize;

/// The model entry that prices runs whose model has no entry of its own
/// (or that named none).
pub const ANY_MODEL: &str = "*";

/// Prices per million of each usage counter, per model.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Prices {
    /// The currency, as ISO 4217 writes it (`USD`, `EUR`).
    pub currency: String,
    /// Model → usage counter (`inputTokens`, …) → price per million.
    pub per_million: BTreeMap<String, BTreeMap<String, f64>>,
}

impl Prices {
    /// The table `NARAD_CONSOLE_PRICES` gives (JSON: `{"model":
    /// {"inputTokens": 2.5, "outputTokens": 10}, "*": {…}}`, prices per
    /// million), in `currency`, checked; none without a table.
    pub fn from_settings(table: Option<&str>, currency: &str) -> Result<Option<Prices>, String> {
        let Some(table) = table.map(str::trim).filter(|t| !t.is_empty()) else {
            return Ok(None);
        };
        let example = r#"e.g. {"gpt-4o": {"inputTokens": 2.5, "outputTokens": 10}, "*": {"inputTokens": 1, "outputTokens": 4}}"#;
        let per_million: BTreeMap<String, BTreeMap<String, serde_json::Value>> =
            serde_json::from_str(table).map_err(|e| {
                format!(
                    "NARAD_CONSOLE_PRICES is not a table of models, each an object of usage counters and their prices per million ({example}): {e}"
                )
            })?;
        let mut checked = BTreeMap::new();
        for (model, counters) in per_million {
            if model.trim().is_empty() {
                return Err("NARAD_CONSOLE_PRICES names an empty model: name it, or use \"*\" for every other model".to_owned());
            }
            let mut prices = BTreeMap::new();
            for (counter, price) in counters {
                match price.as_f64() {
                    Some(p) if p.is_finite() && p >= 0.0 && !counter.is_empty() => {
                        prices.insert(counter, p);
                    }
                    _ => {
                        return Err(format!(
                            "NARAD_CONSOLE_PRICES: {model:?} prices {counter:?} at {price}: a price per million is a number, 0 or more, of a named counter"
                        ));
                    }
                }
            }
            checked.insert(model, prices);
        }
        let currency = currency.trim();
        if currency.len() != 3 || !currency.bytes().all(|b| b.is_ascii_uppercase()) {
            return Err(format!(
                "NARAD_CONSOLE_CURRENCY={currency}: a currency is its ISO 4217 code, three capital letters (USD, EUR)"
            ));
        }
        Ok(Some(Prices {
            currency: currency.to_owned(),
            per_million: checked,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_table_is_read_and_checked() {
        assert_eq!(Prices::from_settings(None, "USD"), Ok(None));
        assert_eq!(Prices::from_settings(Some("  "), "USD"), Ok(None));
        let prices = Prices::from_settings(
            Some(r#"{"m": {"inputTokens": 2.5, "outputTokens": 10}, "*": {"inputTokens": 0}}"#),
            "EUR",
        )
        .unwrap()
        .unwrap();
        assert_eq!(prices.currency, "EUR");
        assert_eq!(prices.per_million["m"]["outputTokens"], 10.0);
        assert_eq!(prices.per_million[ANY_MODEL]["inputTokens"], 0.0);
        for (table, currency, said) in [
            ("[1]", "USD", "is not a table"),
            (r#"{"m": 3}"#, "USD", "is not a table"),
            (r#"{"m": {"inputTokens": -1}}"#, "USD", "0 or more"),
            (r#"{"m": {"inputTokens": "2"}}"#, "USD", "0 or more"),
            (r#"{"m": {"": 2}}"#, "USD", "named counter"),
            (r#"{" ": {"inputTokens": 2}}"#, "USD", "empty model"),
            (r#"{"m": {"inputTokens": 2}}"#, "dollars", "ISO 4217"),
        ] {
            let error = Prices::from_settings(Some(table), currency).unwrap_err();
            assert!(error.contains(said), "{table} {currency}: {error}");
        }
    }
}
