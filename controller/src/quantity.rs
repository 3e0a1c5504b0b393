//! Kubernetes resource quantities (`10Gi`, `500M`, `1.5Gi`, `1e9`) as whole bytes.

/// The quantity `text` in bytes, rounded up (exact: integer arithmetic); `None` when it is not
/// a quantity (the schema refuses those before custody sees them) or is negative. A quantity
/// too large for 64 bits is `u64::MAX`.
pub fn bytes(text: &str) -> Option<u64> {
    let text = text.trim();
    let text = text.strip_prefix('+').unwrap_or(text);
    let split = text
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(text.len());
    let (number, suffix) = text.split_at(split);
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    if !whole
        .bytes()
        .chain(fraction.bytes())
        .all(|c| c.is_ascii_digit())
    {
        return None;
    }
    // value = digits / 10^fraction.len(), times 2^binary, times 10^decimal.
    let digits: u128 = format!("{whole}{fraction}")
        .trim_start_matches('0')
        .parse()
        .or_else(|error: std::num::ParseIntError| match error.kind() {
            std::num::IntErrorKind::Empty => Ok(0),
            _ => Err(()),
        })
        .ok()?;
    let (binary, mut decimal): (u32, i32) = match suffix {
        "" => (0, 0),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        exponent if exponent.starts_with(['e', 'E']) => (0, exponent[1..].parse().ok()?),
        _ => return None,
    };
    decimal -= i32::try_from(fraction.len()).ok()?;
    let scaled = |value: u128| -> Option<u128> {
        let value = value.checked_mul(1u128.checked_shl(binary)?)?;
        if decimal >= 0 {
            value.checked_mul(10u128.checked_pow(decimal.unsigned_abs())?)
        } else {
            let divisor = 10u128.checked_pow(decimal.unsigned_abs())?;
            Some(value.div_ceil(divisor))
        }
    };
    Some(match scaled(digits) {
        Some(bytes) => u64::try_from(bytes).unwrap_or(u64::MAX),
        None if digits == 0 => 0,
        None => u64::MAX,
    })
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
            ("1.1e2", Some(110)),
            ("0.5Ki", Some(512)),
            (".5Ki", Some(512)),
            ("1e100", Some(u64::MAX)),
            ("100Ei", Some(u64::MAX)),
            ("1e-3", Some(1)),
            ("0", Some(0)),
            ("1.2.3", None),
        ];
        for (text, want) in rows {
            assert_eq!(bytes(text), want, "{text}");
        }
    }
}
