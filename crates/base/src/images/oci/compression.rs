//! A layer's bytes as the tar they hold: plain, gzip or zstd, told apart
//! by how they start (registries and layouts name the same in the media
//! type, which is not trusted for it).

use std::io::{BufRead, BufReader, Read};

use super::OciError;

/// How a gzip stream starts.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
/// How a zstd frame starts.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];
/// The largest window (2^27 bytes, libzstd's own default limit) a zstd
/// layer may make the decoder hold: a frame may ask for up to 2 GiB.
pub const ZSTD_WINDOW_LOG_MAX: u32 = 27;

/// `layer`'s bytes uncompressed.
pub(crate) fn decompressed<'a>(layer: impl Read + 'a) -> Result<Box<dyn Read + 'a>, OciError> {
    let mut buffered = BufReader::new(layer);
    let head = buffered
        .fill_buf()
        .map_err(|e| OciError::io("reading a layer", e))?;
    if head.starts_with(&GZIP_MAGIC) {
        return Ok(Box::new(flate2::read::GzDecoder::new(buffered)));
    }
    if head.starts_with(&ZSTD_MAGIC) {
        let mut zstd = zstd::stream::read::Decoder::with_buffer(buffered)
            .map_err(|e| OciError::io("reading a zstd layer", e))?;
        zstd.window_log_max(ZSTD_WINDOW_LOG_MAX)
            .map_err(|e| OciError::io("reading a zstd layer", e))?;
        return Ok(Box::new(zstd));
    }
    Ok(Box::new(buffered))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(bytes: &[u8]) -> std::io::Result<Vec<u8>> {
        let mut out = Vec::new();
        decompressed(bytes)
            .map_err(std::io::Error::other)?
            .read_to_end(&mut out)?;
        Ok(out)
    }

    #[test]
    fn zstd_layers_are_read_and_hashed_uncompressed() {
        let tar = b"a tar's bytes, as they were".repeat(100);
        assert_eq!(read_all(&tar).unwrap(), tar, "plain");
        let zstd = zstd::encode_all(&tar[..], 3).unwrap();
        assert_eq!(read_all(&zstd).unwrap(), tar, "zstd");
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &tar).unwrap();
        assert_eq!(read_all(&gz.finish().unwrap()).unwrap(), tar, "gzip");
        // A frame asking for a larger window than allowed is refused.
        let mut big_window = zstd::stream::write::Encoder::new(Vec::new(), 3).unwrap();
        big_window
            .set_parameter(zstd::zstd_safe::CParameter::WindowLog(
                ZSTD_WINDOW_LOG_MAX + 1,
            ))
            .unwrap();
        big_window.long_distance_matching(true).unwrap();
        std::io::Write::write_all(&mut big_window, &vec![7u8; 1 << 20]).unwrap();
        let refused = big_window.finish().unwrap();
        let err = read_all(&refused).unwrap_err();
        assert!(err.to_string().contains("memory"), "{err}");
    }
}
