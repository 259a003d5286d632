//! SHA-1 as a `const fn`, so every script's SHA is computed at compile time.
//!
//! Redis names cached scripts by the SHA-1 of their source; computing it here means a
//! client never needs `SCRIPT LOAD` to learn it. SHA-1 is used only as that name, never
//! for security.

/// The SHA-1 digest of `data`.
pub const fn digest(data: &[u8]) -> [u8; 20] {
    digest_parts(&[data])
}

/// The SHA-1 digest of `parts` one after the other, as if concatenated (a script is its
/// prelude, its libraries and its own file, each stored once in the binary).
pub const fn digest_strs(parts: &[&str]) -> [u8; 20] {
    let mut bytes: [&[u8]; 16] = [&[]; 16];
    assert!(parts.len() <= bytes.len(), "at most 16 parts");
    let mut i = 0;
    while i < parts.len() {
        bytes[i] = parts[i].as_bytes();
        i += 1;
    }
    digest_parts(&bytes)
}

/// The message bytes of `parts` in order: the part and the offset of the next one.
struct Cursor<'a> {
    parts: &'a [&'a [u8]],
    part: usize,
    at: usize,
}

impl Cursor<'_> {
    const fn next(&mut self) -> u8 {
        while self.at >= self.parts[self.part].len() {
            self.part += 1;
            self.at = 0;
        }
        self.at += 1;
        self.parts[self.part][self.at - 1]
    }
}

const fn digest_parts(parts: &[&[u8]]) -> [u8; 20] {
    let mut h: [u32; 5] = [0x6745_2301, 0xEFCD_AB89, 0x98BA_DCFE, 0x1032_5476, 0xC3D2_E1F0];
    let mut len = 0;
    let mut p = 0;
    while p < parts.len() {
        len += parts[p].len();
        p += 1;
    }
    let mut data = Cursor { parts, part: 0, at: 0 };
    // Message, then 0x80, zeros, and the 64-bit bit length, padded to 64-byte blocks.
    let padded = (len + 9).div_ceil(64) * 64;
    let mut block = 0;
    while block < padded / 64 {
        let mut w = [0u32; 80];
        let mut i = 0;
        while i < 16 {
            let mut word = 0u32;
            let mut j = 0;
            while j < 4 {
                let idx = block * 64 + i * 4 + j;
                // Bytes are read in order, so the cursor walks the parts once.
                let byte = if idx < len { data.next() } else { padding_byte(len, idx, padded) };
                word = (word << 8) | byte as u32;
                j += 1;
            }
            w[i] = word;
            i += 1;
        }
        while i < 80 {
            w[i] = (w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]).rotate_left(1);
            i += 1;
        }
        let (mut a, mut b, mut c, mut d, mut e) = (h[0], h[1], h[2], h[3], h[4]);
        let mut t = 0;
        while t < 80 {
            let (f, k) = if t < 20 {
                ((b & c) | (!b & d), 0x5A82_7999)
            } else if t < 40 {
                (b ^ c ^ d, 0x6ED9_EBA1)
            } else if t < 60 {
                ((b & c) | (b & d) | (c & d), 0x8F1B_BCDC)
            } else {
                (b ^ c ^ d, 0xCA62_C1D6)
            };
            let tmp = a.rotate_left(5).wrapping_add(f).wrapping_add(e).wrapping_add(k).wrapping_add(w[t]);
            e = d;
            d = c;
            c = b.rotate_left(30);
            b = a;
            a = tmp;
            t += 1;
        }
        h[0] = h[0].wrapping_add(a);
        h[1] = h[1].wrapping_add(b);
        h[2] = h[2].wrapping_add(c);
        h[3] = h[3].wrapping_add(d);
        h[4] = h[4].wrapping_add(e);
        block += 1;
    }
    let mut out = [0u8; 20];
    let mut i = 0;
    while i < 20 {
        out[i] = (h[i / 4] >> (24 - 8 * (i % 4))) as u8;
        i += 1;
    }
    out
}

/// Byte `idx` (at or past `len`) of the padding of a `len`-byte message.
const fn padding_byte(len: usize, idx: usize, padded: usize) -> u8 {
    if idx == len {
        0x80
    } else if idx >= padded - 8 {
        let bits = (len as u64).wrapping_mul(8);
        (bits >> (8 * (padded - 1 - idx))) as u8
    } else {
        0
    }
}

/// The digest as 40 lowercase hex digits, the form Redis uses.
pub const fn hex(digest: [u8; 20]) -> [u8; 40] {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = [0u8; 40];
    let mut i = 0;
    while i < 20 {
        out[2 * i] = DIGITS[(digest[i] >> 4) as usize];
        out[2 * i + 1] = DIGITS[(digest[i] & 0xf) as usize];
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(s: &[u8]) -> alloc::string::String {
        alloc::string::String::from_utf8(hex(digest(s)).to_vec()).unwrap()
    }

    #[test]
    fn known_vectors() {
        assert_eq!(h(b""), "da39a3ee5e6b4b0d3255bfef95601890afd80709");
        assert_eq!(h(b"abc"), "a9993e364706816aba3e25717850c26c9cd0d89d");
        // 56 bytes: the length no longer fits in the first block.
        assert_eq!(
            h(b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"),
            "84983e441c3bd26ebaae4aa1f95129e5e54670f1"
        );
        let million = alloc::vec![b'a'; 1_000_000];
        assert_eq!(h(&million), "34aa973cd4c4daa4f61eeb2bdbad27316534016f");
    }
}

/// HMAC-SHA-1 (RFC 2104) of `message` under `key`.
pub fn hmac(key: &[u8], message: &[u8]) -> [u8; 20] {
    let mut block = [0u8; 64];
    if key.len() > 64 {
        block[..20].copy_from_slice(&digest(key));
    } else {
        block[..key.len()].copy_from_slice(key);
    }
    let mut inner = alloc::vec::Vec::with_capacity(64 + message.len());
    inner.extend(block.iter().map(|b| b ^ 0x36));
    inner.extend_from_slice(message);
    let mut outer = alloc::vec::Vec::with_capacity(84);
    outer.extend(block.iter().map(|b| b ^ 0x5c));
    outer.extend_from_slice(&digest(&inner));
    digest(&outer)
}

#[cfg(test)]
mod hmac_tests {
    #[test]
    fn rfc_2202_vectors() {
        let h = |k: &[u8], m: &[u8]| alloc::string::String::from_utf8(super::hex(super::hmac(k, m)).to_vec()).unwrap();
        assert_eq!(h(&[0x0b; 20], b"Hi There"), "b617318655057264e28bc0b6fb378c8ef146be00");
        assert_eq!(h(b"Jefe", b"what do ya want for nothing?"), "effcdf6ae5eb2fa2d27416d5f184df9c259a7c79");
        assert_eq!(
            h(&[0xaa; 80], b"Test Using Larger Than Block-Size Key - Hash Key First"),
            "aa4ae5e15272d00e95705637ce8a3b55ed402112"
        );
    }
}
