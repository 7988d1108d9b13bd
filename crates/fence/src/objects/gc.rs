//! Listing what the store holds and collecting what no publication
//! needs: objects that are neither published nor a recent candidate, by
//! the store's own clock.

use super::*;

impl ObjectKit {
    /// Every stored object (manifests included) under `under`, with its key
    /// relative to the prefix.
    async fn walk(
        &self,
        under: &str,
    ) -> Result<Vec<(String, object_store::ObjectMeta)>, ObjectError> {
        relative_path(under)?;
        let prefix_len = self.prefix.parts().count();
        let mut found = Vec::new();
        let mut dirs = vec![self.full(under)];
        while let Some(dir) = dirs.pop() {
            let listing = self.store.list_with_delimiter(Some(&dir)).await?;
            dirs.extend(listing.common_prefixes);
            for meta in listing.objects {
                let key = meta
                    .location
                    .parts()
                    .skip(prefix_len)
                    .map(|p| p.as_ref().to_string())
                    .collect::<Vec<_>>()
                    .join("/");
                found.push((key, meta));
            }
        }
        Ok(found)
    }

    /// Keys of the objects (not manifests) under `under`, sorted.
    pub async fn list(&self, under: &str) -> Result<Vec<String>, ObjectError> {
        let mut keys: Vec<String> = self
            .walk(under)
            .await?
            .into_iter()
            .map(|(k, _)| k)
            .filter(|k| !k.ends_with(".manifest"))
            .collect();
        keys.sort();
        Ok(keys)
    }

    /// Deletes objects (and their manifests) under `under` that no pointer
    /// references and that are older than `retention`. The published keys
    /// (`published`) and anything younger than `retention` are always kept.
    /// Ages come from the store's modification times, measured against the
    /// store's own clock (the modification time of a marker written now),
    /// never this machine's.
    pub async fn gc(
        &self,
        under: &str,
        published: &HashSet<String>,
        retention: Duration,
    ) -> Result<GcReport, ObjectError> {
        let now_ms = self.store_now_ms().await?;
        let cutoff_ms = now_ms - retention.as_millis() as i64;
        let mut report = GcReport::default();
        for (relative, meta) in self.walk(under).await? {
            let object_key = relative.strip_suffix(".manifest").unwrap_or(&relative);
            if published.contains(object_key) {
                report.kept_published += 1;
            } else if meta.last_modified.timestamp_millis() > cutoff_ms {
                report.kept_young += 1;
            } else {
                self.store.delete(&meta.location).await?;
                report.deleted.push(relative);
            }
        }
        report.deleted.sort();
        Ok(report)
    }
}

impl ObjectKit {
    /// The store's clock: the modification time it gives a marker object
    /// written now (then deleted; garbage collection may delete).
    async fn store_now_ms(&self) -> Result<i64, ObjectError> {
        let nonce = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let marker = self.full(&format!(
            ".baton-probe/clock-{nonce}-{}",
            std::process::id()
        ));
        self.store
            .put_opts(
                &marker,
                PutPayload::from_static(b"clock"),
                PutOptions {
                    mode: PutMode::Create,
                    ..Default::default()
                },
            )
            .await?;
        let meta = self.store.head(&marker).await?;
        self.store.delete(&marker).await?;
        Ok(meta.last_modified.timestamp_millis())
    }
}
