//! What every Event we post must respect.

/// Longest Event message kube-apiserver accepts for an Event with an `eventTime` (1024
/// bytes, `NoteLengthLimit` in pkg/apis/core/validation/events.go): a longer one is
/// refused with 422, and the Event is lost.
pub const MESSAGE_MAX: usize = 1024;

/// `message` cut to at most [`MESSAGE_MAX`] bytes at a character boundary, with an
/// ellipsis when it was cut.
pub fn message(mut message: String) -> String {
    if message.len() <= MESSAGE_MAX {
        return message;
    }
    let mut cut = MESSAGE_MAX - '…'.len_utf8();
    while !message.is_char_boundary(cut) {
        cut -= 1;
    }
    message.truncate(cut);
    message.push('…');
    message
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_message_is_kept_and_a_long_one_cut_at_a_character_boundary() {
        assert_eq!(message("drained".into()), "drained");
        let exact = "a".repeat(MESSAGE_MAX);
        assert_eq!(message(exact.clone()), exact);
        // 'é' is two bytes: the cut must not split one.
        let long = "é".repeat(MESSAGE_MAX);
        let cut = message(long);
        assert!(cut.len() <= MESSAGE_MAX, "{}", cut.len());
        assert!(cut.ends_with('…'));
        assert!(cut.trim_end_matches('…').chars().all(|c| c == 'é'));
    }
}
