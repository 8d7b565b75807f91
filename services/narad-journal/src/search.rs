//! Search: sessions found by what people said and answered in them and by
//! their titles, filtered by state, open interrupts, actor and time, newest
//! match first, with the matching passages.
//!
//! Postgres full-text search over the journal itself (migration
//! `20261211000001_search.sql`): one partial GIN index on `events` keeps the
//! documents of people's messages and interrupts' questions and answers,
//! another on `sessions` their titles. Every document also holds a lexeme
//! naming its tenant (and its actor), which each query ANDs, so that the
//! index answers with one tenant's rows.

use serde::Serialize;
use serde_json::Value;

use crate::sessions::{SESSION_COLUMNS, record};
use crate::{Journal, JournalError, SessionRecord, TenantId, in_tenant};

/// Which sessions a search keeps, by their state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum SessionState {
    /// Not archived.
    Open,
    /// Archived.
    Archived,
    /// With an active top-level execution.
    Running,
    /// Not archived and with no active top-level execution.
    Idle,
}

impl SessionState {
    /// The state named `name` (`open`, `archived`, `running`, `idle`).
    pub fn parse(name: &str) -> Option<SessionState> {
        Some(match name {
            "open" => SessionState::Open,
            "archived" => SessionState::Archived,
            "running" => SessionState::Running,
            "idle" => SessionState::Idle,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            SessionState::Open => "open",
            SessionState::Archived => "archived",
            SessionState::Running => "running",
            SessionState::Idle => "idle",
        }
    }
}

/// Where a page of results starts: after the session with this match time
/// (microseconds since the epoch) and id, in newest-first order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SearchCursor {
    /// The previous page's last match time.
    pub at_micros: i64,
    /// The previous page's last session.
    pub session_id: String,
}

/// The earliest cursor time (microseconds since the epoch, about 4368
/// BC): nothing is recorded before it, and Postgres holds times back to
/// 4713 BC only. A later cursor (up to the 18 digits the document allows,
/// about AD 33,000) is within its range.
pub const EARLIEST_CURSOR: i64 = -200_000_000_000_000_000;

impl SearchCursor {
    /// The cursor as `nextAfter` writes it.
    pub fn encode(&self) -> String {
        format!("{}.{}", self.at_micros, self.session_id)
    }

    /// A cursor `encode` wrote; `None` for anything else. A time before
    /// any Postgres holds (4713 BC) is taken as [`EARLIEST_CURSOR`]: the
    /// same page (nothing is older), where Postgres would fail.
    pub fn decode(text: &str) -> Option<SearchCursor> {
        let (at, session) = text.split_once('.')?;
        Some(SearchCursor {
            at_micros: at.parse::<i64>().ok()?.max(EARLIEST_CURSOR),
            session_id: session.to_owned(),
        })
        .filter(|c| !c.session_id.is_empty())
    }
}

/// A search: words, filters and the page.
#[derive(Debug, Clone, Default)]
pub struct SearchQuery {
    /// Words in web-search syntax (`"a phrase"`, `or`, `-word`), matched
    /// with English stemming; none: the filters alone.
    pub words: Option<String>,
    /// Only sessions in this state.
    pub state: Option<SessionState>,
    /// Only sessions with (`true`) or without (`false`) open interrupts.
    pub pending_approvals: Option<bool>,
    /// Only messages and answers of this subject (an actor's `sub`).
    pub actor: Option<String>,
    /// Only matches at or after this time (microseconds since the epoch);
    /// with neither words nor actor, sessions created at or after it.
    pub since: Option<i64>,
    /// Only matches before this time; with neither words nor actor,
    /// sessions created before it.
    pub until: Option<i64>,
    /// After this result.
    pub after: Option<SearchCursor>,
}

/// A session found, with why.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SearchResult {
    /// The session.
    pub session: SessionRecord,
    /// Its newest match (RFC 3339); with neither words nor actor, when it
    /// was created.
    #[schema(schema_with = crate::openapi::timestamp)]
    pub at: String,
    /// How many of its entries match (0 with neither words nor actor).
    #[schema(schema_with = crate::openapi::uint)]
    pub match_count: u64,
    /// Its newest matches, at most three, newest first.
    pub matches: Vec<SearchMatch>,
    /// Its interrupts waiting for an answer.
    #[schema(schema_with = crate::openapi::uint)]
    pub open_interrupts: u64,
    #[serde(skip)]
    at_micros: i64,
}

impl SearchResult {
    /// The cursor of the page after this result.
    pub fn cursor(&self) -> SearchCursor {
        SearchCursor {
            at_micros: self.at_micros,
            session_id: self.session.session_id.clone(),
        }
    }
}

/// What matched: the session's title, a person's message, an interrupt's
/// question or its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub enum MatchField {
    /// The session's title.
    Title,
    /// A person's message (`message.user.recorded`).
    Message,
    /// What an interrupt asked (`interrupt.requested`: title, message).
    Question,
    /// How an interrupt was answered (`interrupt.resolved`: decision, reason).
    Answer,
}

/// One matching entry, with the passage that matched.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SearchMatch {
    /// What matched.
    pub field: MatchField,
    /// The event (absent for the title).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = crate::openapi::id)]
    pub event_id: Option<String>,
    /// Its sessionSequence (absent for the title).
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(schema_with = crate::openapi::uint)]
    pub session_sequence: Option<u64>,
    /// When it was recorded (the session's creation for the title).
    #[schema(schema_with = crate::openapi::timestamp)]
    pub at: String,
    /// Who said or answered it, as the event names them.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Object)]
    pub actor: Option<Value>,
    /// The passage, in pieces: the matched words are marked `matched`.
    pub snippet: Vec<SnippetPart>,
}

/// A piece of a passage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct SnippetPart {
    /// The text.
    pub text: String,
    /// Whether the search's words matched it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub matched: bool,
}

/// Marks a matched word in ts_headline's output (private-use characters,
/// removed from the text first).
const START: char = '\u{E000}';
const STOP: char = '\u{E001}';

/// The matches of each result on the page: the newest three of the
/// session's hits in `hits` (numbered `rn` newest first within their
/// session), with their passages (the marks ts_headline writes are removed
/// from the text first).
fn matches_of(hits: &str) -> String {
    // What the entry says (bounded as its document is), or the title.
    let content = "search_bounded(coalesce(search_content(e.type, e.body), to_jsonb(s.title)))";
    format!(
        "(select coalesce(jsonb_agg(m order by m.micros desc), '[]') from ( \
           select h.micros, e.event_id, h.session_sequence, e.type, e.body -> 'actor' as actor, \
             rfc3339(h.at) as at, \
             case when q.words is null then {content} \
               else ts_headline('english'::regconfig, \
                 translate({content}::text, '{START}{STOP}', '')::jsonb, \
                 q.words, 'StartSel={START}, StopSel={STOP}, MaxWords=24, MinWords=10') \
             end as passage \
           from {hits} h left join events e \
             on e.tenant_id = $1 and e.session_id = h.session_id and e.session_sequence = h.session_sequence \
           where h.session_id = s.session_id and h.rn <= 3) m)"
    )
}

/// The filters on the session row `s` every search applies.
const SESSION_FILTERS: &str = "\
    ($6::text is null \
      or ($6 = 'open' and s.archived_at is null) \
      or ($6 = 'archived' and s.archived_at is not null) \
      or ($6 = 'running' and s.core ? 'slot') \
      or ($6 = 'idle' and s.archived_at is null and not s.core ? 'slot')) \
    and ($7::boolean is null or $7 = exists (select 1 from interrupt_deadlines d \
      where d.tenant_id = $1 and d.session_id = s.session_id))";

/// The search of words or an actor: hits in the index, grouped by session.
fn by_matches() -> String {
    format!(
        "with q as ( \
           select words, coalesce(words && actor, words, actor) as full \
           from (select case when $2::text is null then null else websearch_to_tsquery('english', $2) end as words, \
                   search_tag_query('actor', $3::text) as actor) parts \
         ), \
         hits as materialized ( \
           select h.session_id, h.session_sequence, h.at, \
             (extract(epoch from h.at) * 1000000)::bigint as micros \
           from q, search_hits(q.full, $3::text is null and q.words is not null) h \
           where ($4::bigint is null or h.at >= timestamptz 'epoch' + $4 * interval '1 microsecond') \
             and ($5::bigint is null or h.at < timestamptz 'epoch' + $5 * interval '1 microsecond') \
             and not (h.type = 'message.user.recorded' and exists (select 1 from events r \
               where r.tenant_id = $1 and r.session_id = h.session_id and r.type = 'message.redacted' \
                 and r.body ->> 'messageId' = h.message_id)) \
         ), \
         ranked as ( \
           select session_id as sid, max(micros) as micros, max(at) as at, count(*) as match_count \
           from hits group by session_id \
         ), \
         page as materialized ( \
           select r.sid, r.micros, r.at, r.match_count \
           from ranked r join sessions s on s.tenant_id = $1 and s.session_id = r.sid \
           where {SESSION_FILTERS} \
             and ($8::bigint is null or (r.micros, s.session_id) < ($8, $9::text)) \
           order by r.micros desc, s.session_id desc limit $10 \
         ), \
         newest as materialized ( \
           select h.*, row_number() over (partition by h.session_id order by h.micros desc) as rn \
           from hits h where h.session_id in (select sid from page) \
         ) \
         select {SESSION_COLUMNS}, p.micros, \
           rfc3339(p.at), p.match_count, \
           (select count(*) from interrupt_deadlines d where d.tenant_id = $1 and d.session_id = s.session_id), \
           {matches} \
         from page p join sessions s on s.tenant_id = $1 and s.session_id = p.sid, q \
         order by p.micros desc, s.session_id desc",
        matches = matches_of("newest"),
    )
}

/// The search of filters alone: sessions newest first. It takes the
/// parameters of [`by_matches`] (words and actor, `$2` and `$3`, are null
/// here) so that one list serves both and shares [`SESSION_FILTERS`].
fn by_filters() -> String {
    format!(
        "select {SESSION_COLUMNS}, (extract(epoch from s.created_at) * 1000000)::bigint, \
           rfc3339(s.created_at), 0::bigint, \
           (select count(*) from interrupt_deadlines d where d.tenant_id = $1 and d.session_id = s.session_id), \
           '[]'::jsonb \
         from sessions s \
         where s.tenant_id = $1 and $2::text is null and $3::text is null and {SESSION_FILTERS} \
           and ($4::bigint is null or s.created_at >= timestamptz 'epoch' + $4 * interval '1 microsecond') \
           and ($5::bigint is null or s.created_at < timestamptz 'epoch' + $5 * interval '1 microsecond') \
           and ($8::bigint is null or (s.created_at, s.session_id) < \
             (timestamptz 'epoch' + $8 * interval '1 microsecond', $9::text)) \
         order by s.created_at desc, s.session_id desc limit $10"
    )
}

impl Journal {
    /// Searches `tenant`'s sessions: at most `limit` results, newest match
    /// first. Words that hold nothing searchable (only stop words such as
    /// "the", or punctuation) find nothing, and say so: as a query they
    /// would match everything.
    pub async fn search(
        &self,
        tenant: &TenantId,
        query: &SearchQuery,
        limit: u32,
    ) -> Result<Found, JournalError> {
        let client = self.pool.get().await?;
        let words = query
            .words
            .as_deref()
            .map(str::trim)
            .filter(|w| !w.is_empty());
        let state = query.state.map(SessionState::name);
        let (at, session) = match &query.after {
            Some(c) => (Some(c.at_micros), Some(c.session_id.as_str())),
            None => (None, None),
        };
        in_tenant(client, tenant, async |c| {
            if let Some(words) = words {
                let check = c
                    .prepare_cached("select numnode(websearch_to_tsquery('english', $1))")
                    .await?;
                let nodes: i32 = c.query_one(&check, &[&words]).await?.get(0);
                if nodes == 0 {
                    return Ok(Found {
                        results: Vec::new(),
                        unsearchable_words: true,
                    });
                }
            }
            let sql = if words.is_some() || query.actor.is_some() {
                by_matches()
            } else {
                by_filters()
            };
            let stmt = c.prepare_cached(&sql).await?;
            let rows = c
                .query(
                    &stmt,
                    &[
                        &tenant.as_str(),
                        &words,
                        &query.actor,
                        &query.since,
                        &query.until,
                        &state,
                        &query.pending_approvals,
                        &at,
                        &session,
                        &i64::from(limit),
                    ],
                )
                .await?;
            Ok(Found {
                results: rows.iter().map(result).collect::<Result<_, _>>()?,
                unsearchable_words: false,
            })
        })
        .await
    }
}

/// What a search found.
#[derive(Debug, Clone, PartialEq)]
pub struct Found {
    /// The sessions, newest match first.
    pub results: Vec<SearchResult>,
    /// The words held nothing searchable, so nothing was looked for.
    pub unsearchable_words: bool,
}

fn result(row: &tokio_postgres::Row) -> Result<SearchResult, JournalError> {
    let matches: Value = row.get(11);
    let matches = matches
        .as_array()
        .map(|all| all.iter().map(search_match).collect())
        .unwrap_or_default();
    Ok(SearchResult {
        session: record(row)?,
        at_micros: row.get(7),
        at: row.get(8),
        match_count: row.get::<_, i64>(9) as u64,
        open_interrupts: row.get::<_, i64>(10) as u64,
        matches,
    })
}

fn search_match(m: &Value) -> SearchMatch {
    let field = match m["type"].as_str() {
        Some("message.user.recorded") => MatchField::Message,
        Some("interrupt.requested") => MatchField::Question,
        Some("interrupt.resolved") => MatchField::Answer,
        _ => MatchField::Title,
    };
    SearchMatch {
        field,
        event_id: m["event_id"].as_str().map(str::to_owned),
        session_sequence: m["session_sequence"].as_u64(),
        at: m["at"].as_str().unwrap_or_default().to_owned(),
        actor: Some(m["actor"].clone()).filter(|a| a.is_object()),
        snippet: snippet(&m["passage"]),
    }
}

/// The pieces of a passage: ts_headline's JSON (a string, or an array of
/// strings for a message of several parts), its marks turned into
/// `matched` pieces.
fn snippet(passage: &Value) -> Vec<SnippetPart> {
    let text = match passage {
        Value::String(s) => s.clone(),
        Value::Array(parts) => parts
            .iter()
            .filter_map(Value::as_str)
            .collect::<Vec<_>>()
            .join(" "),
        Value::Null => String::new(),
        other => other.to_string(),
    };
    let mut parts: Vec<SnippetPart> = Vec::new();
    let mut matched = false;
    for piece in text.split([START, STOP]) {
        if !piece.is_empty() {
            match parts.last_mut() {
                Some(last) if last.matched == matched => last.text.push_str(piece),
                _ => parts.push(SnippetPart {
                    text: piece.to_owned(),
                    matched,
                }),
            }
        }
        matched = !matched;
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_reads_back_as_written() {
        let c = SearchCursor {
            at_micros: 1_765_000_000_123_456,
            session_id: "ses.with.dots".into(),
        };
        assert_eq!(SearchCursor::decode(&c.encode()), Some(c));
        assert_eq!(SearchCursor::decode("x.ses"), None);
        assert_eq!(SearchCursor::decode("12."), None);
        assert_eq!(SearchCursor::decode("12"), None);
    }

    #[test]
    fn a_passage_is_cut_at_its_marks() {
        let parts = snippet(&Value::from(
            "We \u{E000}refund\u{E001} the \u{E000}order\u{E001}",
        ));
        let shown: Vec<(&str, bool)> = parts.iter().map(|p| (p.text.as_str(), p.matched)).collect();
        assert_eq!(
            shown,
            [
                ("We ", false),
                ("refund", true),
                (" the ", false),
                ("order", true)
            ]
        );
        let parts = snippet(&serde_json::json!(["first \u{E000}part\u{E001}", "second"]));
        assert_eq!(parts.len(), 3);
        assert_eq!(parts[2].text, " second");
    }
}
