//! Text from pieces of bytes: whole UTF-8 characters only, and prefixes cut on a character.

/// The length of `bytes` without a trailing UTF-8 sequence that is cut short (at most three
/// bytes, which the next read may complete). Output arrives in pipe-sized pieces that can end
/// inside a character; sending such a piece as text would turn both halves into U+FFFD.
/// Invalid bytes that no later byte can complete are left for the lossy conversion.
pub fn utf8_complete_len(bytes: &[u8]) -> usize {
    let len = bytes.len();
    for back in 1..=len.min(4) {
        let byte = bytes[len - back];
        if byte & 0xC0 == 0x80 {
            continue; // a continuation byte: the character starts further back
        }
        let needs = match byte {
            0xF0..=0xF7 => 4,
            0xE0..=0xEF => 3,
            0xC0..=0xDF => 2,
            _ => 1,
        };
        return if needs > back { len - back } else { len };
    }
    len
}

/// Turns pipe-sized pieces of bytes into text, holding back a character cut short (at most
/// three bytes) for the piece that completes it. Invalid bytes become U+FFFD, exactly as one
/// `String::from_utf8_lossy` of the whole stream would make them.
#[derive(Debug, Default)]
pub struct Utf8Decoder {
    carry: Vec<u8>,
}

impl Utf8Decoder {
    /// The whole characters `data` completes.
    pub fn decode(&mut self, data: &[u8]) -> String {
        if self.carry.is_empty() {
            let cut = utf8_complete_len(data);
            self.carry.extend_from_slice(&data[cut..]);
            return String::from_utf8_lossy(&data[..cut]).into_owned();
        }
        let mut bytes = std::mem::take(&mut self.carry);
        bytes.extend_from_slice(data);
        let cut = utf8_complete_len(&bytes);
        self.carry.extend_from_slice(&bytes[cut..]);
        bytes.truncate(cut);
        String::from_utf8(bytes)
            .unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
    }

    /// What is held back, once no more bytes will come.
    pub fn finish(&mut self) -> String {
        let rest = std::mem::take(&mut self.carry);
        String::from_utf8_lossy(&rest).into_owned()
    }
}

/// `text` cut to at most `max` bytes, on a character boundary.
pub(super) fn prefix_bytes(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut cut = max;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    &text[..cut]
}

/// `text` cut to its first `max` characters.
pub(super) fn prefix_chars(text: &str, max: usize) -> &str {
    match text.char_indices().nth(max) {
        Some((end, _)) => &text[..end],
        None => text,
    }
}
