use super::*;

fn dir(tag: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("baton-store-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
}

fn lease(n: u8, counter: u64) -> (ResourceName, LeaseRecord) {
    let record = LeaseRecord {
        acquisition_digest: AcquisitionId::from_bytes([n; 16]).digest(),
        token: FencingToken::new(Epoch::FIRST, counter).unwrap(),
        ttl_ms: 5_000,
        session: None,
        holder: n
            .is_multiple_of(2)
            .then(|| baton_core::Holder::parse(&format!("worker {n}")).unwrap()),
        shape: baton_core::Shape::Exclusive,
    };
    (ResourceName::parse(&format!("r{n}")).unwrap(), record)
}

#[test]
fn commits_survive_reopen_and_deletes_apply_in_order() {
    let d = dir("reopen");
    {
        let mut s = RedbStore::open(&d).unwrap();
        let (r1, l1) = lease(1, 1);
        let (r2, l2) = lease(2, 2);
        s.commit(&[
            Write::PutLease {
                resource: r1.clone(),
                record: l1,
            },
            Write::PutLease {
                resource: r2,
                record: l2.clone(),
            },
            Write::DeleteLease { resource: r1 },
            Write::Tokens {
                epoch: Epoch::FIRST,
                counter: 2,
            },
        ])
        .unwrap();
    }
    let s = RedbStore::open(&d).unwrap();
    let stored = s.load().unwrap();
    assert_eq!(stored.counter, 2);
    assert_eq!(stored.leases, vec![lease(2, 2)]);
    assert!(matches!(RedbStore::open(&d), Err(StoreError::InUse { .. })));
    drop(s);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn sessions_and_bound_leases_survive_reopen() {
    let d = dir("sessions");
    let s1 = AcquisitionId::from_bytes([41; 16]).digest();
    let s2 = AcquisitionId::from_bytes([42; 16]).digest();
    let (r1, mut l1) = lease(1, 1);
    l1.session = Some(s1);
    let (r2, l2) = lease(2, 2);
    {
        let mut s = RedbStore::open(&d).unwrap();
        // Before the first session, a store has no session table at all.
        assert!(s.load().unwrap().sessions.is_empty());
        s.commit(&[
            Write::PutSession {
                record: SessionRecord {
                    digest: s1,
                    ttl_ms: 3_000,
                    opener: Some("alice".into()),
                },
            },
            Write::PutSession {
                record: SessionRecord {
                    digest: s2,
                    ttl_ms: 4_000,
                    opener: None,
                },
            },
            Write::PutLease {
                resource: r1.clone(),
                record: l1.clone(),
            },
            Write::PutLease {
                resource: r2.clone(),
                record: l2.clone(),
            },
            Write::DeleteSession { digest: s2 },
        ])
        .unwrap();
    }
    let s = RedbStore::open(&d).unwrap();
    let stored = s.load().unwrap();
    assert_eq!(
        stored.sessions,
        vec![SessionRecord {
            digest: s1,
            ttl_ms: 3_000,
            opener: Some("alice".into()),
        }]
    );
    assert_eq!(stored.leases, vec![(r1, l1), (r2, l2)]);
    drop(s);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn fresh_store_replaces_old_state_with_new_epoch() {
    let d = dir("fresh");
    {
        let mut s = RedbStore::open(&d).unwrap();
        let (r, l) = lease(1, 9);
        s.commit(&[
            Write::PutLease {
                resource: r,
                record: l,
            },
            Write::Tokens {
                epoch: Epoch::FIRST,
                counter: 9,
            },
        ])
        .unwrap();
    }
    assert_eq!(RedbStore::peek_epoch(&d).unwrap(), Some(Epoch::FIRST));
    let e7 = Epoch::new(7).unwrap();
    RedbStore::create_fresh(&d, e7).unwrap();
    let stored = RedbStore::open(&d).unwrap().load().unwrap();
    assert_eq!(
        (stored.epoch, stored.counter, stored.leases.len()),
        (e7, 0, 0)
    );
    std::fs::remove_dir_all(&d).unwrap();
}

fn served(tag: &str, counter: u64) -> PathBuf {
    let d = dir(tag);
    let mut s = RedbStore::open(&d).unwrap();
    let (r, l) = lease(1, counter);
    s.commit(&[
        Write::PutLease {
            resource: r,
            record: l,
        },
        Write::Tokens {
            epoch: Epoch::FIRST,
            counter,
        },
    ])
    .unwrap();
    d
}

#[test]
fn a_missing_or_empty_store_in_a_used_directory_is_refused() {
    let d = served("lost", 5);
    std::fs::write(RedbStore::path_in(&d), b"").unwrap();
    let err = RedbStore::open(&d).err().expect("empty store refused");
    assert!(
        matches!(err, StoreError::StoreLost { state: "empty", .. }),
        "{err}"
    );
    std::fs::remove_file(RedbStore::path_in(&d)).unwrap();
    let err = RedbStore::open(&d).err().expect("missing store refused");
    assert!(
        matches!(
            err,
            StoreError::StoreLost {
                state: "missing",
                ..
            }
        ),
        "{err}"
    );
    assert!(
        !RedbStore::path_in(&d).exists(),
        "refusing must not create a store"
    );
    // A restore is the way back, above the epoch the directory used.
    assert_eq!(RedbStore::peek_epoch(&d).unwrap(), Some(Epoch::FIRST));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn an_empty_store_file_without_identity_is_refused_too() {
    let d = dir("empty-legacy");
    std::fs::create_dir_all(&d).unwrap();
    std::fs::write(RedbStore::path_in(&d), b"").unwrap();
    assert!(matches!(
        RedbStore::open(&d),
        Err(StoreError::StoreLost { .. })
    ));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn a_zeroed_store_file_is_a_corrupt_error_not_a_panic() {
    let d = served("zeroed", 3);
    let path = RedbStore::path_in(&d);
    let len = std::fs::metadata(&path).unwrap().len() as usize;
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[4096.min(len)..].fill(0);
    std::fs::write(&path, &bytes).unwrap();
    let err = RedbStore::open(&d).err().expect("zeroed store refused");
    assert!(err.to_string().contains("baton.redb"), "{err}");
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn another_servers_store_or_an_older_copy_is_refused() {
    let a = served("mismatch-a", 9);
    let b = served("mismatch-b", 2);
    let old_copy = std::fs::read(RedbStore::path_in(&a)).unwrap();
    std::fs::copy(RedbStore::path_in(&b), RedbStore::path_in(&a)).unwrap();
    assert!(matches!(
        RedbStore::open(&a),
        Err(StoreError::IdentityMismatch { .. })
    ));
    // The same store, copied back after it went on to issue more tokens.
    std::fs::write(RedbStore::path_in(&a), &old_copy).unwrap();
    {
        let mut s = RedbStore::open(&a).unwrap();
        s.commit(&[Write::Tokens {
            epoch: Epoch::FIRST,
            counter: 20,
        }])
        .unwrap();
    }
    // The floor moves when the store is opened, so open once more.
    drop(RedbStore::open(&a).unwrap());
    std::fs::write(RedbStore::path_in(&a), &old_copy).unwrap();
    // With the log beside it, the old copy is moved on by the log's records.
    assert_eq!(RedbStore::open(&a).unwrap().load().unwrap().counter, 20);
    // An epoch change folds the log into redb and leaves it empty: now an
    // old copy of the store file has nothing to move it on, and is refused.
    {
        let mut s = RedbStore::open(&a).unwrap();
        s.commit(&[Write::Tokens {
            epoch: Epoch::new(2).unwrap(),
            counter: 1,
        }])
        .unwrap();
    }
    drop(RedbStore::open(&a).unwrap());
    std::fs::write(RedbStore::path_in(&a), &old_copy).unwrap();
    assert!(matches!(
        RedbStore::open(&a),
        Err(StoreError::BehindFloor { .. })
    ));
    std::fs::remove_dir_all(&a).unwrap();
    std::fs::remove_dir_all(&b).unwrap();
}

#[test]
fn a_format_1_store_is_migrated_to_digests_and_gets_an_identity() {
    let d = dir("migrate");
    std::fs::create_dir_all(&d).unwrap();
    let id = AcquisitionId::from_bytes([9; 16]);
    {
        let db = Database::create(RedbStore::path_in(&d)).unwrap();
        let txn = db.begin_write().unwrap();
        {
            let mut meta = txn.open_table(META).unwrap();
            meta.insert("format", FORMAT_WITH_IDS).unwrap();
            meta.insert("epoch", 1).unwrap();
            meta.insert("counter", 4).unwrap();
            let mut leases = txn.open_table(LEASES).unwrap();
            let mut value = [0u8; LEASE_LEN_BYTES];
            value[..16].copy_from_slice(id.as_bytes());
            value[16..24].copy_from_slice(
                &FencingToken::new(Epoch::FIRST, 4)
                    .unwrap()
                    .get()
                    .to_be_bytes(),
            );
            value[24..].copy_from_slice(&5_000u64.to_be_bytes());
            leases.insert("job", &value[..]).unwrap();
        }
        txn.commit().unwrap();
    }
    let s = RedbStore::open(&d).unwrap();
    let stored = s.load().unwrap();
    assert_eq!(stored.leases[0].1.acquisition_digest, id.digest());
    let raw = std::fs::read(RedbStore::path_in(&d)).unwrap();
    assert!(
        !raw.windows(16).any(|w| w == id.as_bytes()),
        "the acquisition id is still in the file"
    );
    let identity = Identity::read(&d).unwrap().unwrap();
    assert_eq!(
        (identity.floor_epoch, identity.floor_counter),
        (Epoch::FIRST, 4)
    );
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn an_epoch_change_raises_the_identity_floor() {
    let d = served("epoch", 1);
    let e2 = Epoch::new(2).unwrap();
    let mut s = RedbStore::open(&d).unwrap();
    s.commit(&[Write::Tokens {
        epoch: e2,
        counter: 1,
    }])
    .unwrap();
    assert_eq!(Identity::read(&d).unwrap().unwrap().floor_epoch, e2);
    drop(s);
    std::fs::remove_dir_all(&d).unwrap();
}

/// `n` commits through a log of `log_len` bytes, reopening (as after a
/// crash: nothing flushed beyond the commits) every `reopen_every`, then
/// checks the state against what the commits wrote.
fn commit_through_the_log(tag: &str, log_len: u64, n: u64, reopen_every: u64) {
    let d = dir(tag);
    let put = |n: u64| Write::PutLease {
        resource: ResourceName::parse(&format!("log:{}", n % 50)).unwrap(),
        record: LeaseRecord {
            acquisition_digest: AcquisitionId::from_bytes([n as u8; 16]).digest(),
            token: FencingToken::new(Epoch::FIRST, n).unwrap(),
            ttl_ms: 5_000,
            session: None,
            holder: n
                .is_multiple_of(7)
                .then(|| baton_core::Holder::parse(&format!("w{n}")).unwrap()),
            shape: baton_core::Shape::Exclusive,
        },
    };
    let tokens = |n: u64| Write::Tokens {
        epoch: Epoch::FIRST,
        counter: n,
    };
    let mut s = RedbStore::open_with_log(&d, log_len).unwrap();
    for i in 1..=n {
        let mut writes = vec![put(i), tokens(i)];
        if i.is_multiple_of(7) {
            writes.push(Write::DeleteLease {
                resource: ResourceName::parse(&format!("log:{}", i % 50)).unwrap(),
            });
        }
        s.commit(&writes).unwrap();
        if i.is_multiple_of(reopen_every) {
            drop(s);
            s = RedbStore::open_with_log(&d, log_len).unwrap();
        }
    }
    drop(s);
    let s = RedbStore::open(&d).unwrap();
    let stored = s.load().unwrap();
    assert_eq!(stored.counter, n);
    // Each of the 50 names holds its last put, unless a delete came after.
    let mut expect: Vec<u64> = (n - 49..=n)
        .filter(|i: &u64| !i.is_multiple_of(7))
        .collect();
    expect.sort_by_key(|i| format!("log:{}", i % 50));
    let got: Vec<u64> = stored
        .leases
        .iter()
        .map(|(_, l)| l.token.get() & 0xff_ffff_ffff)
        .collect();
    assert_eq!(got, expect);
    drop(s);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn commits_go_to_the_log_and_survive_checkpoints_and_reopen() {
    // A 4 KiB log holds a few dozen commits: 500 cross many checkpoints.
    commit_through_the_log("log-small", 4096, 500, 1_000);
    // A 64 KiB log folds part of its keys into redb every 64 commits once
    // half full; reopening mid-way replays over those partial folds.
    commit_through_the_log("log-folds", 64 << 10, 3_000, 977);
}

#[test]
fn a_lost_log_is_refused_but_a_store_from_before_logs_gets_one() {
    let d = dir("log-lost");
    {
        let mut s = RedbStore::open(&d).unwrap();
        s.commit(&[Write::Tokens {
            epoch: Epoch::FIRST,
            counter: 5,
        }])
        .unwrap();
    }
    // The commit is only in the log: losing it must not start from redb.
    std::fs::remove_file(crate::wal::Wal::path_in(&d)).unwrap();
    let err = RedbStore::open(&d).err().expect("a lost log is refused");
    assert!(matches!(err, StoreError::LogLost { .. }), "{err}");
    assert!(err.to_string().contains("baton.wal"), "{err}");
    std::fs::remove_dir_all(&d).unwrap();

    // A store written before logs existed has no `log` key and no log file.
    let d = dir("log-upgrade");
    drop(RedbStore::open(&d).unwrap());
    {
        let db = redb::Database::open(RedbStore::path_in(&d)).unwrap();
        let txn = db.begin_write().unwrap();
        txn.open_table(META).unwrap().remove("log").unwrap();
        txn.commit().unwrap();
    }
    std::fs::remove_file(crate::wal::Wal::path_in(&d)).unwrap();
    let mut s = RedbStore::open(&d).unwrap();
    s.commit(&[Write::Tokens {
        epoch: Epoch::FIRST,
        counter: 3,
    }])
    .unwrap();
    drop(s);
    assert_eq!(RedbStore::open(&d).unwrap().load().unwrap().counter, 3);
    // From now on its log counts: losing it is refused too.
    std::fs::remove_file(crate::wal::Wal::path_in(&d)).unwrap();
    assert!(matches!(
        RedbStore::open(&d),
        Err(StoreError::LogLost { .. })
    ));
    std::fs::remove_dir_all(&d).unwrap();
}

/// A snapshot taken between commits reads its moment even after the log
/// was checkpointed into redb and folded in part many times since.
#[test]
fn a_snapshot_reads_its_moment_across_checkpoints_and_folds() {
    let d = dir("snapshot-folds");
    for log_len in [4096, 64 << 10] {
        let _ = std::fs::remove_dir_all(&d);
        let mut s = RedbStore::open_with_log(&d, log_len).unwrap();
        let mut taken = Vec::new();
        for i in 1..=1_500u64 {
            let (resource, record) = lease((i % 40) as u8, i);
            let mut writes = vec![
                Write::PutLease { resource, record },
                Write::Tokens {
                    epoch: Epoch::FIRST,
                    counter: i,
                },
            ];
            if i.is_multiple_of(3) {
                writes.push(Write::DeleteLease {
                    resource: lease(((i + 7) % 40) as u8, i).0,
                });
            }
            s.commit(&writes).unwrap();
            if i.is_multiple_of(250) {
                taken.push((s.load().unwrap(), s.snapshot().unwrap().unwrap()));
            }
        }
        for (expected, snapshot) in taken {
            let read = snapshot().unwrap();
            assert_eq!(read.counter, expected.counter, "log {log_len}");
            assert_eq!(read.leases, expected.leases, "log {log_len}");
        }
        drop(s);
    }
    std::fs::remove_dir_all(&d).unwrap();
}

/// Many keys through small logs: the background fold is often mid-way
/// (batches of 64 keys in tests) while commits go on, the logs rotate, and
/// the store is reopened now and then. Every load, mid-fold or after a
/// reopen, holds exactly what was committed.
/// Loads as a restart does, the leases read as they are taken, and checks
/// that they stay within the count the stream gave before the first read.
fn load_streamed(s: &RedbStore) -> Stored {
    let mut loaded = None;
    s.load_with(&mut |loading| {
        let n_max = loading.leases.size_hint().1.expect("an upper bound");
        let stored = loading.read_all().unwrap();
        assert!(
            stored.leases.len() <= n_max,
            "{} leases read, {n_max} at most said",
            stored.leases.len()
        );
        loaded = Some(stored);
    })
    .unwrap();
    loaded.expect("handed over")
}

#[test]
fn background_folds_never_hide_or_bring_back_a_key() {
    use std::collections::BTreeMap;
    let d = dir("background-folds");
    let log_len = 64 << 10;
    let mut model: BTreeMap<String, u64> = BTreeMap::new();
    let as_map = |stored: Stored| -> BTreeMap<String, u64> {
        stored
            .leases
            .into_iter()
            .map(|(r, l)| (r.to_string(), l.token.get() & 0xff_ffff_ffff))
            .collect()
    };
    let mut s = RedbStore::open_with_log(&d, log_len).unwrap();
    let mut folds = 0;
    let mut busy = 0;
    for i in 1..=4_000u64 {
        let key = format!("bg:{:04}", (i * 7_919) % 1_500);
        let resource = ResourceName::parse(&key).unwrap();
        let write = if i.is_multiple_of(5) && model.contains_key(&key) {
            model.remove(&key);
            Write::DeleteLease { resource }
        } else {
            model.insert(key, i);
            Write::PutLease {
                resource,
                record: LeaseRecord {
                    acquisition_digest: AcquisitionId::from_bytes([i as u8; 16]).digest(),
                    token: FencingToken::new(Epoch::FIRST, i).unwrap(),
                    ttl_ms: 5_000,
                    session: None,
                    holder: None,
                    shape: baton_core::Shape::Exclusive,
                },
            }
        };
        let tokens = Write::Tokens {
            epoch: Epoch::FIRST,
            counter: i,
        };
        s.commit(&[write, tokens]).unwrap();
        // The gauge's count is the frozen set's, read without its lock.
        let (frozen, counted) = s.folder.with_frozen(|f| (f.len(), s.folder.backlog()));
        assert_eq!(frozen, counted, "the backlog after commit {i}");
        busy += usize::from(s.fold_backlog() > Some(0));
        if i.is_multiple_of(89) {
            let stored = load_streamed(&s);
            assert_eq!(stored.counter, i);
            assert_eq!(as_map(stored), model, "a load after commit {i}");
        }
        if i.is_multiple_of(1_331) {
            folds += s.folder.folds();
            drop(s);
            s = RedbStore::open_with_log(&d, log_len).unwrap();
            assert_eq!(
                as_map(s.load().unwrap()),
                model,
                "reopened after commit {i}"
            );
        }
    }
    folds += s.folder.folds();
    assert!(
        folds > 20,
        "the background thread folded ({folds} transactions)"
    );
    assert!(busy > 0, "a commit returned while a fold was under way");
    drop(s);
    let s = RedbStore::open(&d).unwrap();
    let stored = s.load().unwrap();
    assert_eq!(stored.counter, 4_000);
    assert_eq!(as_map(stored), model);
    drop(s);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn ended_leases_are_kept_across_a_reopen_and_a_fold_then_dropped_by_time() {
    let d = dir("ended");
    let digest = |n: u8| AcquisitionId::from_bytes([n; 16]).digest();
    {
        let mut s = RedbStore::open(&d).unwrap();
        assert_eq!(s.ended().unwrap(), vec![]);
        s.commit(&[Write::LeaseEnded { digest: digest(1) }])
            .unwrap();
        assert_eq!(s.ended().unwrap(), vec![digest(1)], "from the log");
    }
    {
        // Replayed from the log; then an epoch change folds it into redb.
        let mut s = RedbStore::open(&d).unwrap();
        assert_eq!(s.ended().unwrap(), vec![digest(1)]);
        s.commit(&[
            Write::LeaseEnded { digest: digest(2) },
            Write::Tokens {
                epoch: Epoch::new(2).unwrap(),
                counter: 0,
            },
        ])
        .unwrap();
        let mut ended = s.ended().unwrap();
        ended.sort();
        let mut both = vec![digest(1), digest(2)];
        both.sort();
        assert_eq!(ended, both, "from redb");
    }
    // Kept for KEPT_MS by the wall clock, then dropped by the next write.
    let db = Database::open(RedbStore::path_in(&d)).unwrap();
    let now_ms = ended::wall_ms();
    let txn = db.begin_read().unwrap();
    assert_eq!(
        ended::read(&txn, vec![], now_ms + ended::KEPT_MS - 5_000)
            .unwrap()
            .len(),
        2
    );
    assert_eq!(
        ended::read(&txn, vec![], now_ms + ended::KEPT_MS + 60_000).unwrap(),
        vec![]
    );
    drop(txn);
    let txn = db.begin_write().unwrap();
    ended::keep(&txn, &[digest(3)], now_ms + ended::KEPT_MS + 60_000).unwrap();
    txn.commit().unwrap();
    let txn = db.begin_read().unwrap();
    assert_eq!(
        ended::read(&txn, vec![], 0).unwrap(),
        vec![digest(3)],
        "the old two dropped"
    );
    drop((txn, db));
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn ended_leases_of_one_millisecond_share_a_row_and_the_per_lease_table_is_dropped() {
    let d = dir("ended-rows");
    let digest = |n: u8| AcquisitionId::from_bytes([n; 16]).digest();
    drop(RedbStore::open(&d).unwrap());
    let db = Database::open(RedbStore::path_in(&d)).unwrap();
    let now_ms = ended::wall_ms();
    for batch in [&[digest(1), digest(2)][..], &[digest(3)]] {
        let txn = db.begin_write().unwrap();
        ended::keep(&txn, batch, now_ms).unwrap();
        txn.commit().unwrap();
    }
    let txn = db.begin_read().unwrap();
    assert_eq!(
        ended::read(&txn, vec![], now_ms).unwrap(),
        vec![digest(1), digest(2), digest(3)],
        "a second write in the same millisecond adds to its row"
    );
    drop(txn);
    // The table of one row per lease that unreleased builds wrote.
    let old: TableDefinition<(u64, [u8; 16]), ()> = TableDefinition::new("ended");
    let txn = db.begin_write().unwrap();
    txn.open_table(old)
        .unwrap()
        .insert((now_ms, [9; 16]), ())
        .unwrap();
    txn.commit().unwrap();
    drop(db);
    let s = RedbStore::open(&d).unwrap();
    assert_eq!(s.ended().unwrap().len(), 3, "the kept rows stay");
    drop(s);
    let db = Database::open(RedbStore::path_in(&d)).unwrap();
    let gone = db.begin_read().unwrap().open_table(old).err();
    assert!(
        matches!(gone, Some(redb::TableError::TableDoesNotExist(_))),
        "{gone:?}"
    );
    drop(db);
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn kept_changes_come_back_in_order_across_folds_and_reopens_the_last_n_asked() {
    let d = dir("history");
    let change = |seq: u64| {
        Write::Changed(baton_core::NumberedChange {
            seq,
            change: baton_core::Change {
                kind: baton_core::HolderChange::Released,
                resource: format!("h:{}", seq % 13),
                slot: seq.is_multiple_of(3).then_some(seq as u32 % 5),
                token: FencingToken::new(Epoch::FIRST, seq).unwrap(),
                revoked: None,
                holder: seq
                    .is_multiple_of(2)
                    .then(|| baton_core::Holder::parse(&format!("w{seq}")).unwrap()),
            },
        })
    };
    // A 16 KiB log rotates and folds every hundred or so commits.
    let mut s = RedbStore::open_with_log(&d, 16 << 10).unwrap();
    for i in 0..1_000u64 {
        s.commit(&[change(2 * i + 1), change(2 * i + 2)]).unwrap();
        if i == 611 {
            drop(s);
            s = RedbStore::open_with_log(&d, 16 << 10).unwrap();
        }
    }
    drop(s);
    let s = RedbStore::open(&d).unwrap();
    let all = s.history(usize::MAX).unwrap();
    assert_eq!(all.seq, 2_000);
    let seqs: Vec<u64> = all.changes.iter().map(|c| c.seq).collect();
    assert_eq!(seqs, (1..=2_000).collect::<Vec<_>>(), "every one, in order");
    assert_eq!(Write::Changed(all.changes[1_233].clone()), change(1_234));
    let last = s.history(100).unwrap();
    assert_eq!(last.seq, 2_000);
    assert_eq!(last.changes, all.changes[1_900..].to_vec(), "the last 100");
    assert_eq!(s.history(0).unwrap().changes, vec![]);
    drop(s);
    std::fs::remove_dir_all(&d).unwrap();
}

/// A restart's load reads redb on a thread of its own, in batches, and
/// merges the log's writes as the batches are taken: across several
/// batches it gives what a snapshot (read on one thread) gives, and a
/// taker that stops early does not hold the load up.
#[test]
fn a_load_read_in_batches_is_the_state_and_may_stop_early() {
    use std::collections::BTreeMap;
    let d = dir("load-batches");
    let mut s = RedbStore::open_with_log(&d, 64 << 10).unwrap();
    let put = |n: u64, counter: u64| Write::PutLease {
        resource: ResourceName::parse(&format!("batch:{n:05}")).unwrap(),
        record: LeaseRecord {
            acquisition_digest: AcquisitionId::from_bytes([n as u8; 16]).digest(),
            token: FencingToken::new(Epoch::FIRST, counter).unwrap(),
            ttl_ms: 5_000,
            session: None,
            holder: None,
            shape: baton_core::Shape::Exclusive,
        },
    };
    let n_leases = 3 * super::load::BATCH_LEN as u64 + 17;
    let mut model = BTreeMap::new();
    let mut counter = 0;
    for chunk in (0..n_leases).collect::<Vec<_>>().chunks(500) {
        let writes: Vec<Write> = chunk
            .iter()
            .map(|&n| {
                counter += 1;
                model.insert(format!("batch:{n:05}"), counter);
                put(n, counter)
            })
            .collect();
        s.commit(&writes).unwrap();
    }
    // Then writes that stay in the log: deletes and puts spread over every
    // batch, and names before, between and after the stored ones.
    let mut last = Vec::new();
    for n in (0..n_leases + 40).step_by(97) {
        counter += 1;
        let name = format!("batch:{n:05}");
        if n % 2 == 0 {
            model.remove(&name);
            last.push(Write::DeleteLease {
                resource: ResourceName::parse(&name).unwrap(),
            });
        } else {
            model.insert(name, counter);
            last.push(put(n, counter));
        }
    }
    last.push(Write::Tokens {
        epoch: Epoch::FIRST,
        counter,
    });
    s.commit(&last).unwrap();
    let as_map = |stored: &Stored| -> BTreeMap<String, u64> {
        (stored.leases.iter())
            .map(|(r, l)| (r.to_string(), l.token.get() & 0xff_ffff_ffff))
            .collect()
    };
    let loaded = load_streamed(&s);
    assert_eq!(as_map(&loaded), model);
    assert_eq!(loaded, s.snapshot().unwrap().unwrap()().unwrap());
    assert!(
        loaded.leases.len() > 2 * super::load::BATCH_LEN,
        "three batches at least"
    );
    // A taker that reads five leases and leaves: the reader stops.
    let mut taken = 0;
    s.load_with(&mut |loading| taken = loading.leases.take(5).count())
        .unwrap();
    assert_eq!(taken, 5);
    drop(s);
    std::fs::remove_dir_all(&d).unwrap();
}
