//! Sequence numbers compared with serial-number arithmetic: `a` is before
//! `b` when `b - a`, wrapping, is below half the space.

/// `a` comes before `b`.
pub fn before(a: u32, b: u32) -> bool {
    (a.wrapping_sub(b) as i32) < 0
}

/// `a` comes before or is `b`.
pub fn before_eq(a: u32, b: u32) -> bool {
    a == b || before(a, b)
}

/// Frames from `from` up to (not including) `to`.
pub fn distance(from: u32, to: u32) -> u32 {
    to.wrapping_sub(from)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_wraps() {
        assert!(before(1, 2) && !before(2, 1) && !before(3, 3));
        assert!(before(u32::MAX, 0) && before(u32::MAX - 5, 3));
        assert_eq!(distance(u32::MAX, 2), 3);
    }
}
