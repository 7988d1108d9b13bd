//! `Watch` answers encoded once, sent to many.
//!
//! A change goes to every watcher of its prefix. Encoded per watcher, a
//! hundred watchers cost a hundred conversions and encodings of the same
//! event; here the server encodes each event once ([`encode_event`]), as
//! the entry it is inside `WatchEvents.events`, and every watcher's answer
//! is those bytes laid end to end behind two short headers
//! ([`EncodedWatchResponse::events`]). The bytes are exactly what prost
//! writes for the same `v1::WatchResponse` (tested below), so clients see
//! no difference.

use bytes::{BufMut, Bytes, BytesMut};
use prost::encoding::{encode_key, encode_varint, encoded_len_varint, key_len, WireType};
use prost::Message;

use crate::v1::{self, watch_response::Body};

/// Field numbers of `WatchResponse.events` and `WatchEvents.events`.
const RESPONSE_EVENTS_FIELD: u32 = 2;
const EVENTS_EVENT_FIELD: u32 = 1;

/// One event as an entry of `WatchEvents.events`: key, length, message.
pub fn encode_event(event: &v1::WatchEvent) -> Bytes {
    let len = event.encoded_len();
    let mut buf = BytesMut::with_capacity(key_len(EVENTS_EVENT_FIELD) + 10 + len);
    prost::encoding::message::encode(EVENTS_EVENT_FIELD, event, &mut buf);
    buf.freeze()
}

/// A `WatchResponse`, already encoded. Only the server sends it; it never
/// decodes one (a client decodes `v1::WatchResponse`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EncodedWatchResponse(Bytes);

impl EncodedWatchResponse {
    pub fn new(message: &v1::WatchResponse) -> Self {
        Self(message.encode_to_vec().into())
    }

    /// A `WatchEvents` answer of events encoded by [`encode_event`], in
    /// order.
    pub fn events<'a>(entries: impl Iterator<Item = &'a [u8]> + Clone) -> Self {
        let inner_len: usize = entries.clone().map(<[u8]>::len).sum();
        let len = key_len(RESPONSE_EVENTS_FIELD) + encoded_len_varint(inner_len as u64) + inner_len;
        let mut buf = BytesMut::with_capacity(len);
        encode_key(RESPONSE_EVENTS_FIELD, WireType::LengthDelimited, &mut buf);
        encode_varint(inner_len as u64, &mut buf);
        for entry in entries {
            buf.put_slice(entry);
        }
        Self(buf.freeze())
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

impl From<Body> for EncodedWatchResponse {
    fn from(body: Body) -> Self {
        Self::new(&v1::WatchResponse { body: Some(body) })
    }
}

impl Message for EncodedWatchResponse {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        buf.put_slice(&self.0);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl bytes::Buf,
        ctx: prost::encoding::DecodeContext,
    ) -> Result<(), prost::DecodeError> {
        // Never decoded: a field is skipped, not kept.
        prost::encoding::skip_field(wire_type, tag, buf, ctx)
    }

    fn encoded_len(&self) -> usize {
        self.0.len()
    }

    fn clear(&mut self) {
        self.0 = Bytes::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(seq: u64, resource: &str, holder: &str) -> v1::WatchEvent {
        v1::WatchEvent {
            seq,
            kind: v1::watch_event::Kind::Granted.into(),
            resource: resource.into(),
            token: (1 << 40) + seq,
            revoked_token: 0,
            holder: holder.into(),
            slot: seq.is_multiple_of(2).then_some(3),
        }
    }

    #[test]
    fn events_encoded_once_are_the_bytes_prost_writes_for_the_answer() {
        let long = "h".repeat(300); // a length that takes two varint bytes
        for events in [
            vec![event(1, "a", "")],
            vec![event(2, "jobs:1", &long), event(3, "jobs:2", "w-1")],
            (1..=600).map(|n| event(n, "r", "x")).collect(),
        ] {
            let entries: Vec<Bytes> = events.iter().map(encode_event).collect();
            let ours = EncodedWatchResponse::events(entries.iter().map(|e| &e[..]));
            let prost = v1::WatchResponse {
                body: Some(Body::Events(v1::WatchEvents {
                    events: events.clone(),
                })),
            };
            assert_eq!(ours.as_bytes(), &prost.encode_to_vec()[..]);
            assert_eq!(ours.encode_to_vec(), prost.encode_to_vec());
            assert_eq!(v1::WatchResponse::decode(ours.as_bytes()).unwrap(), prost);
        }
    }

    #[test]
    fn any_answer_encodes_as_itself() {
        let snapshot = v1::WatchResponse {
            body: Some(Body::Snapshot(v1::WatchSnapshot {
                seq: 7,
                holders: Vec::new(),
                complete: true,
            })),
        };
        let ours = EncodedWatchResponse::new(&snapshot);
        assert_eq!(ours.encode_to_vec(), snapshot.encode_to_vec());
        assert_eq!(ours.encoded_len(), snapshot.encoded_len());
    }
}
