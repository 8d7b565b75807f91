//! A group in one round trip, for sessions this process knows.
//!
//! When every session of a group is [known](crate::known) (this process's
//! last append transaction to it committed, and nothing it knows has been
//! forgotten since) and its requests touch only entities that transaction
//! read whole, the requests are decided on that knowledge, before any
//! statement: no locks, entities or eventIds are read first. `BEGIN`, per
//! tenant the tenant setting, the guard and the write, then `COMMIT` go in
//! one pipelined round trip. The guard (`append_guard`) locks the sessions
//! without waiting and raises unless each row is still the version known,
//! no eventId of the requests is stored or erased and no agent runtime
//! holds a run journal a backend's request touches; a raised guard aborts
//! the transaction, so its write and `COMMIT` write nothing, and the group
//! is written the two-round-trip way.
//!
//! Not tried (the two-round-trip way at once): a session not known, a
//! request touching an entity or run journal not read whole, a request
//! under a runtime lease or for a closing repair, a backend's
//! workflow-scoped event, and a request that frees the run slot or lets a
//! workflow go idle (the queue and pending cancellations are read in the
//! transaction).

use std::collections::{BTreeMap, BTreeSet};

use deadpool_postgres::Client;
use narad_protocol::primitives::SessionId;

use super::{GUARD, GUARD_FAILED, Outcome, Param, Request, SessionWork, WRITE, write_sessions};
use crate::append::Fence;
use crate::known::KnownSessions;
use crate::{BEGIN_SCOPED, TenantId, scope};

/// Tries `requests` in one round trip (see the module's documentation):
/// every request's outcome once committed; `None` when not tried (nothing
/// was sent) or when its transaction failed (the guard, or any other
/// error: its `COMMIT`, sent with the rest, ended it, and nothing was
/// written), for the caller to write them in two.
pub(crate) async fn write(
    client: &Client,
    requests: &mut [Request],
    commit: &str,
    known: &KnownSessions,
) -> Option<Vec<Outcome>> {
    if !requests.iter().all(eligible) {
        return None;
    }
    // Sessions in lock order: by tenant, then session; requests by arrival.
    let mut sessions: BTreeMap<(TenantId, SessionId), Vec<usize>> = BTreeMap::new();
    for (i, r) in requests.iter().enumerate() {
        sessions
            .entry((r.tenant.clone(), r.session.clone()))
            .or_default()
            .push(i);
    }
    let keys: Vec<(TenantId, SessionId)> = sessions.keys().cloned().collect();
    let entries = known.take_all(&keys)?;

    // Decide every request on what is known, or give up before sending.
    let mut outcomes: Vec<Option<Outcome>> = requests.iter().map(|_| None).collect();
    let mut decided: Vec<(TenantId, SessionId, SessionWork)> = Vec::new();
    for (((tenant, session), members), entry) in sessions.iter().zip(entries) {
        if !super::coverage(members.iter().map(|&i| &requests[i])).is_subset(&entry.keys) {
            return None;
        }
        let mut work = SessionWork::known(session.clone(), entry, BTreeMap::new()).ok()?;
        for &i in members {
            match work.decide(None, &mut requests[i]).await {
                Ok(Some(outcome)) => outcomes[i] = Some(Outcome::Done(outcome)),
                _ => return None,
            }
        }
        decided.push((tenant.clone(), session.clone(), work));
    }

    // Per tenant: the guard's keys and the writes.
    let mut tenants: BTreeMap<TenantId, TenantTrip> = BTreeMap::new();
    let mut knowns = Vec::new();
    for (tenant, session, work) in decided {
        let trip = tenants.entry(tenant.clone()).or_default();
        trip.sessions.push(session.to_string());
        trip.xmins.push(work.xmin.clone());
        let (write, now_known) = work.into_write();
        let wrote = write.is_some();
        trip.writes.extend(write);
        knowns.push(((tenant, session), now_known, wrote));
    }
    for r in requests.iter() {
        let trip = tenants.get_mut(&r.tenant).expect("every tenant has a trip");
        trip.event_ids.extend(
            r.prepared
                .iter()
                .map(|p| p.event.envelope.event_id.to_string()),
        );
        if r.options.fence != Fence::Server {
            for run in r
                .prepared
                .iter()
                .filter_map(|p| p.event.envelope.run.as_ref())
            {
                trip.fenced
                    .insert((r.session.to_string(), run.root_run_id.to_string()));
            }
        }
    }

    let statements =
        futures::try_join!(client.prepare_cached(GUARD), client.prepare_cached(&WRITE),);
    let (guard, write) = statements.ok()?;
    let trips = tenants.iter().map(|(tenant, trip)| {
        let (guard, write) = (&guard, &write);
        let set = scope(tenant);
        async move {
            let t = tenant.as_str();
            let (fenced_sessions, fenced_roots): (Vec<&str>, Vec<&str>) = trip
                .fenced
                .iter()
                .map(|(s, r)| (s.as_str(), r.as_str()))
                .unzip();
            let guard_params: [&Param<'_>; 6] = [
                &t,
                &trip.sessions,
                &trip.xmins,
                &trip.event_ids,
                &fenced_sessions,
                &fenced_roots,
            ];
            // Polled in order on their first poll, so sent in this order.
            let (_, guarded, _) = futures::try_join!(
                client.batch_execute(&set),
                client.query_one(guard, &guard_params),
                async {
                    if trip.writes.is_empty() {
                        Ok(0)
                    } else {
                        write_sessions(client, write, tenant, &trip.writes).await
                    }
                },
            )?;
            Ok::<String, tokio_postgres::Error>(guarded.get(0))
        }
    });
    let sent = futures::try_join!(
        client.batch_execute(BEGIN_SCOPED),
        futures::future::try_join_all(trips),
        client.batch_execute(commit),
    );
    match sent {
        Ok((_, xacts, _)) => {
            known.count(true);
            // Every guard of the transaction returns its one id.
            let xact = xacts.into_iter().next().unwrap_or_default();
            known.remember(knowns.into_iter().map(|(key, mut now, wrote)| {
                if wrote {
                    now.xmin = xact.clone();
                }
                (key, now)
            }));
            Some(
                outcomes
                    .into_iter()
                    .map(|o| o.expect("every request has an outcome"))
                    .collect(),
            )
        }
        Err(e) => {
            known.count(false);
            if e.code().is_some_and(|c| c.code() == GUARD_FAILED) {
                tracing::debug!("an append's guard failed; written in two round trips: {e}");
            } else {
                tracing::debug!("an append in one round trip failed; written in two: {e}");
            }
            None
        }
    }
}

/// Whether a request can be decided without reading its session's work
/// items: the server's own, or a backend's without a runtime lease and
/// without workflow-scoped events (the guard checks its run journals).
fn eligible(r: &Request) -> bool {
    match &r.options.fence {
        Fence::Server => true,
        Fence::Backend { lease: None } => r
            .prepared
            .iter()
            .all(|p| p.event.envelope.run.is_some() || p.event.envelope.workflow.is_none()),
        Fence::Backend { lease: Some(_) } | Fence::Closing => false,
    }
}

/// One tenant's part of the round trip.
#[derive(Default)]
struct TenantTrip {
    sessions: Vec<String>,
    xmins: Vec<String>,
    event_ids: Vec<String>,
    /// (session, rootRunId) of a backend's run events.
    fenced: BTreeSet<(String, String)>,
    writes: Vec<super::SessionWrite>,
}
