//! The session driver, step by step against the scripted server.

use super::*;

/// An acknowledgement held back for 80 ms moves the deadline from the
/// heartbeat's send time, not from when the acknowledgement arrived: the
/// server deadline is no later than the heartbeat's arrival at the server
/// plus the TTL.
#[tokio::test]
async fn a_late_acknowledgement_counts_from_the_heartbeats_send_time() {
    // Heartbeats every 400 ms; silence counts after 200 ms.
    let ttl = Duration::from_millis(1_200);
    let (session, mut end, _streams) = open(1_200).await;
    let mut state = session.watch();
    let (arrived, beat) = end.next().await;
    assert!(matches!(beat.op, Some(Op::Heartbeat(_))), "{beat:?}");
    tokio::time::sleep(Duration::from_millis(80)).await;
    end.answer(beat.id, heartbeat_ack(1_200)).await;
    let acknowledged = timeout(WITHIN, state.wait_for(|s| s.beats == 1))
        .await
        .unwrap()
        .unwrap()
        .clone();
    assert!(
        acknowledged.server_deadline <= arrived + ttl,
        "the deadline counts from the send: {:?} after the arrival plus the TTL",
        acknowledged.server_deadline - (arrived + ttl)
    );
    assert!(acknowledged.safe_until < acknowledged.server_deadline);
    assert_eq!(acknowledged.health, Health::Live);
}

/// Two calls in flight answered in the opposite order: each caller gets
/// its own answer, matched by id.
#[tokio::test]
async fn answers_out_of_order_reach_their_own_callers() {
    let (session, mut end, _streams) = open(3_000).await;
    let (a, b) = (session.clone(), session.clone());
    let first = tokio::spawn(async move { a.acquire("r:a", Duration::ZERO).await });
    let first_request = end.next_call(3_000).await;
    let second = tokio::spawn(async move { b.acquire("r:b", Duration::ZERO).await });
    let second_request = end.next_call(3_000).await;
    assert_ne!(first_request.id, second_request.id);
    end.answer(second_request.id, granted("r:b", 20)).await;
    end.answer(first_request.id, granted("r:a", 10)).await;
    for (call, resource, n) in [(first, "r:a", 10), (second, "r:b", 20)] {
        match call.await.unwrap().unwrap() {
            Acquired::Granted(lease) => {
                assert_eq!(
                    (lease.resource.as_str(), lease.token.get()),
                    (resource, token(n))
                )
            }
            other => panic!("{other:?}"),
        }
    }
}

/// The stream breaks with a call in flight: the call is indeterminate
/// (it may have taken effect), and the driver resumes the same session on
/// a new stream, where the next call is answered.
#[tokio::test]
async fn a_broken_stream_resumes_and_repeats_the_acquire_in_flight() {
    let (session, mut end, mut streams) = open(3_000).await;
    let s = session.clone();
    let call = tokio::spawn(async move { s.acquire("r:x", Duration::ZERO).await });
    let first = end.next_call(3_000).await;
    end.answers
        .send(Err(Status::unavailable("the server went away")))
        .await
        .unwrap();
    let mut resumed = next_stream(&mut streams).await;
    let open = resumed.open(3_000).await;
    assert_eq!(
        open.resume,
        SESSION_ID.to_vec(),
        "the same session is resumed"
    );
    // The acquire whose answer was lost goes again, as a repeat of itself.
    let again = resumed.next_call(3_000).await;
    let (Some(Op::Acquire(a)), Some(Op::Acquire(b))) = (&first.op, &again.op) else {
        panic!("two acquires: {first:?} {again:?}");
    };
    assert_eq!(a.request_id.len(), 16, "a request id is sent");
    assert_eq!(a.request_id, b.request_id, "the same request id");
    assert_eq!(a.first_sent_ms_ago, None, "the first attempt says so");
    assert!(
        b.first_sent_ms_ago.is_some(),
        "the repeat says when the first went"
    );
    resumed.answer(again.id, granted("r:x", 30)).await;
    assert!(matches!(call.await.unwrap(), Ok(Acquired::Granted(_))));
    health_becomes(&session, Health::Live).await;
}

/// A heartbeat left unanswered for a sixth of the TTL: the connection
/// stands but the server is silent, so the driver gives the stream up
/// and resumes on a new one.
#[tokio::test]
async fn a_silent_server_is_left_for_a_new_stream() {
    let (session, mut end, mut streams) = open(3_000).await;
    let (_, beat) = end.next().await;
    assert!(matches!(beat.op, Some(Op::Heartbeat(_))));
    // No answer. The driver's silence limit is 500 ms for this TTL.
    health_becomes(&session, Health::Reconnecting).await;
    let mut resumed = next_stream(&mut streams).await;
    assert_eq!(resumed.open(3_000).await.resume, SESSION_ID.to_vec());
    health_becomes(&session, Health::Live).await;
    drop(end);
}

/// The server answers a heartbeat with `ended`: the session is over and
/// every later call fails with `SessionEnded`, without touching the wire.
#[tokio::test]
async fn an_ended_answer_ends_the_session_for_every_later_call() {
    let (session, mut end, _streams) = open(600).await;
    let (_, beat) = end.next().await;
    end.answer(beat.id, Body::Ended(v1::SessionEnded {})).await;
    health_becomes(&session, Health::Ended).await;
    assert!(matches!(
        session.acquire("r:late", Duration::ZERO).await,
        Err(ClientError::SessionEnded)
    ));
}

/// Dropping the last handle closes the session on the stream.
#[tokio::test]
async fn dropping_the_last_handle_sends_close() {
    let (session, mut end, _streams) = open(3_000).await;
    drop(session);
    let request = end.next_call(3_000).await;
    assert!(matches!(request.op, Some(Op::Close(_))), "{request:?}");
    end.answer(
        request.id,
        Body::Closed(v1::SessionClosed { was_open: true }),
    )
    .await;
}
