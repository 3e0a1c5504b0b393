//! Kubernetes resource quantities (`10Gi`, `500M`, `1.5Gi`, `1e9`) as whole bytes.

/// The quantity `text` in bytes, rounded up; `None` when it is not a quantity (the schema
/// refuses those before custody sees them) or is negative.
pub fn bytes(text: &str) -> Option<u64> {
    let text = text.trim();
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let value: f64 = number.parse().ok()?;
    let factor = match suffix {
        "" => 1.0,
        "Ki" => 1024f64,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        "n" => 1e-9,
        "u" => 1e-6,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        exponent if exponent.starts_with(['e', 'E']) => {
            10f64.powi(exponent[1..].parse::<i32>().ok()?)
        }
        _ => return None,
    };
    let bytes = (value * factor).ceil();
    (bytes.is_finite() && bytes >= 0.0).then(|| bytes.min(u64::MAX as f64) as u64)
}

#[cfg(test)]
mod tests {
    use super::bytes;

    #[test]
    fn quantities_read_as_bytes() {
        let rows = [
            ("10Gi", Some(10 << 30)),
            ("32Mi", Some(32 << 20)),
            ("1.5Gi", Some(3 << 29)),
            ("1Ki", Some(1024)),
            ("500M", Some(500_000_000)),
            ("2k", Some(2000)),
            ("1e3", Some(1000)),
            ("1E6", Some(1_000_000)),
            ("1500m", Some(2)),
            ("4096", Some(4096)),
            ("+1Mi", Some(1 << 20)),
            ("", None),
            ("Gi", None),
            ("10Gb", None),
            ("ten", None),
            ("-1Gi", None),
        ];
        for (text, want) in rows {
            assert_eq!(bytes(text), want, "{text}");
        }
    }
}
