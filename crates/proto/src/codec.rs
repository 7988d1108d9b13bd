//! The gRPC codec: prost's, except that a request that does not decode is
//! the caller's fault.
//!
//! tonic's prost codec answers every decode failure with `INTERNAL`, which
//! reads as a server bug and invites retries of a request that can never
//! succeed (a resource name that is not UTF-8, a truncated message). This
//! codec answers `INVALID_ARGUMENT` naming the rule instead.

use std::marker::PhantomData;

use prost::Message;
use tonic::codec::{BufferSettings, Codec, DecodeBuf, Decoder};
use tonic::Status;
use tonic_prost::{ProstCodec, ProstEncoder};

/// Used by the generated client and server code (see `build.rs`).
#[derive(Debug, Clone, Default)]
pub struct BatonCodec<T, U> {
    _pd: PhantomData<(T, U)>,
}

impl<T, U> Codec for BatonCodec<T, U>
where
    T: Message + Send + 'static,
    U: Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = ProstEncoder<T>;
    type Decoder = BatonDecoder<U>;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(BufferSettings::default())
    }

    fn decoder(&mut self) -> Self::Decoder {
        BatonDecoder { _pd: PhantomData }
    }
}

/// Decodes with prost; a failure is `INVALID_ARGUMENT`.
#[derive(Debug, Clone)]
pub struct BatonDecoder<U> {
    _pd: PhantomData<U>,
}

impl<U: Message + Default> Decoder for BatonDecoder<U> {
    type Item = U;
    type Error = Status;

    fn decode(&mut self, buf: &mut DecodeBuf<'_>) -> Result<Option<U>, Status> {
        U::decode(buf).map(Some).map_err(|e| decode_error(&e))
    }

    fn buffer_settings(&self) -> BufferSettings {
        BufferSettings::default()
    }
}

/// The message for a request that does not decode.
pub fn decode_error(e: &prost::DecodeError) -> Status {
    let detail = e.to_string();
    if detail.contains("UTF-8") {
        Status::invalid_argument(format!(
            "a text field (a resource name or prefix) is not valid UTF-8; names must be UTF-8 ({detail})"
        ))
    } else {
        Status::invalid_argument(format!(
            "the request is not a valid baton.v1 message ({detail})"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_that_is_not_utf8_is_invalid_argument_naming_the_rule() {
        // Field 1 (resources), length 2, bytes 0xff 0xfe.
        let bytes = [0x0a, 0x02, 0xff, 0xfe];
        let e = crate::v1::AcquireRequest::decode(&bytes[..]).unwrap_err();
        let status = decode_error(&e);
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(
            status.message().contains("not valid UTF-8"),
            "{}",
            status.message()
        );
    }
}
