//! Where a PostgreSQL ledger lives: the URL parsed into the driver's settings, the schema, TLS,
//! and the names messages use for it (the URL without its password, and `host:port`).

use std::time::Duration;

use tokio_postgres::{Config, Error as PgError};
use tokio_postgres_rustls::MakeRustlsConnect;

use super::tls;
use crate::errors::{LedgerError, Result};

/// How long opening waits for the server.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Where and how to connect, parsed from the URL.
#[derive(Clone)]
pub(super) struct Target {
    pub(super) config: Config,
    /// TLS as `sslmode`/`sslrootcert` ask (see `tls`); the driver's own `ssl_mode` is set to
    /// match in `config`.
    pub(super) tls: MakeRustlsConnect,
    pub(super) schema: String,
    /// The URL without its password, for messages.
    pub(super) label: String,
    /// `host:port`, for connection messages.
    pub(super) server: String,
    /// `NOTIFY` of the schema's channel (see [`channel`]), sent after each commit that locked
    /// a run.
    pub(super) notify: String,
    /// `LISTEN` on that channel, for `wait_events` (see `listen`).
    pub(super) listen: String,
    /// Whether the `NOTIFY` goes inside the committing transaction (durability `normal`) or
    /// after it (see `tx::Tx::end`).
    pub(super) notify_in_commit: bool,
    /// `?pooler=transaction`: the server is reached through a pooler in transaction mode
    /// (`pool_mode = transaction` in `PgBouncer`), which may hand each transaction to another
    /// server session. Nothing may outlive a transaction then: statements go unnamed, the
    /// settings are `SET LOCAL` in every transaction, and there is no `LISTEN`.
    pub(super) pooled: bool,
}

/// The channel a schema's commits are announced on: `fencepost_` and 32 hex digits of the
/// SHA-256 of the schema's name, a plain identifier under PostgreSQL's 63-byte limit whatever
/// the schema is called (a schema name alone may take all 63). Channels are per database, so
/// this is one channel per ledger.
pub(super) fn channel(schema: &str) -> String {
    let digest = crate::canonical::digest_bytes(schema.as_bytes());
    let hex = digest.trim_start_matches("sha256:");
    format!("fencepost_{}", &hex[..32])
}

/// A schema name fencepost accepts: a plain lowercase SQL identifier, so it never needs
/// quoting rules beyond double quotes.
fn check_schema(schema: &str) -> Result<()> {
    let ok = !schema.is_empty()
        && schema.len() <= 63
        && schema
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_lowercase() || b == b'_')
        && schema
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        && !schema.starts_with("pg_");
    if ok {
        Ok(())
    } else {
        Err(LedgerError::invalid(
            "schema",
            format!(
                "{schema:?} is not a schema fencepost can use; use 1-63 lowercase letters, digits \
                 and underscores, starting with a letter or underscore (not pg_)"
            ),
        ))
    }
}

impl Target {
    /// Parse `postgresql://user[:password]@host[:port]/db[?schema=name&...]`; `schema` (the
    /// keyword) must agree with the URL's if both are given.
    pub(super) fn parse(url: &str, schema: Option<&str>) -> Result<Self> {
        let (base, query) = url.split_once('?').unwrap_or((url, ""));
        let mut url_schema = None;
        let (mut url_sslmode, mut sslrootcert) = (None, None);
        let mut pooled = false;
        let mut rest = Vec::new();
        // fencepost reads these itself: the driver knows neither `schema` nor `sslrootcert`,
        // nor the `verify-*` modes.
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            match pair.split_once('=') {
                Some(("schema", v)) => url_schema = Some(v.to_owned()),
                Some(("sslmode", v)) => url_sslmode = Some(v.to_owned()),
                Some(("sslrootcert", v)) => sslrootcert = Some(percent_decode(v)),
                Some(("pooler", v)) => pooled = pooler(v)?,
                _ => rest.push(pair),
            }
        }
        let ssl_mode = tls::SslMode::parse(url_sslmode.as_deref())?;
        let tls = tls::connector(ssl_mode, sslrootcert.as_deref())?;
        let schema = match (schema, url_schema.as_deref()) {
            (Some(k), Some(u)) if k != u => {
                return Err(LedgerError::invalid(
                    "schema",
                    format!("the keyword says {k:?} but the URL says {u:?}; give one"),
                ))
            }
            (Some(k), _) => k.to_owned(),
            (None, Some(u)) => u.to_owned(),
            (None, None) => "public".to_owned(),
        };
        check_schema(&schema)?;
        let conninfo = if rest.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", rest.join("&"))
        };
        let mut config: Config = conninfo.parse().map_err(|e: PgError| {
            LedgerError::invalid(
                "target",
                format!(
                    "is not a PostgreSQL URL fencepost can use ({e}); write \
                     postgresql://user@host:port/database"
                ),
            )
        })?;
        config
            .application_name("fencepost")
            .connect_timeout(CONNECT_TIMEOUT)
            .ssl_mode(ssl_mode.driver());
        // Every host, each with its port (one port for all when one is given): a multi-host
        // URL is tried in order, and messages name them all.
        let ports = config.get_ports();
        let mut servers: Vec<String> = config
            .get_hosts()
            .iter()
            .enumerate()
            .map(|(i, h)| {
                let host = match h {
                    tokio_postgres::config::Host::Tcp(name) => name.clone(),
                    #[cfg(unix)]
                    tokio_postgres::config::Host::Unix(path) => path.display().to_string(),
                };
                let port = ports.get(i).or(ports.first()).copied().unwrap_or(5432);
                format!("{host}:{port}")
            })
            .collect();
        if servers.is_empty() {
            servers.push(format!(
                "localhost:{}",
                ports.first().copied().unwrap_or(5432)
            ));
        }
        let server = servers.join(",");
        let user = config.get_user().unwrap_or("postgres").to_owned();
        let db = config.get_dbname().unwrap_or(&user).to_owned();
        let mode = if pooled { "&pooler=transaction" } else { "" };
        Ok(Self {
            label: format!("postgresql://{user}@{server}/{db}?schema={schema}{mode}"),
            server,
            config,
            tls,
            notify: format!("NOTIFY {}", channel(&schema)),
            listen: format!("LISTEN {}", channel(&schema)),
            notify_in_commit: false,
            pooled,
            schema,
        })
    }

    /// The password, to remove from any message that might echo it.
    pub(super) fn password(&self) -> Option<&[u8]> {
        self.config.get_password()
    }
}

/// `?pooler=`: whether the ledger talks to a transaction-mode pooler. `session` (a pooler
/// that keeps one server session per client, which behaves as a direct connection) and `none`
/// are the default.
fn pooler(value: &str) -> Result<bool> {
    match value {
        "transaction" => Ok(true),
        "session" | "none" => Ok(false),
        _ => Err(LedgerError::invalid(
            "target",
            format!(
                "pooler={value} is not a pooler mode fencepost knows; write pooler=transaction \
                 for PgBouncer (or another pooler) in transaction mode, or leave it out for a \
                 direct connection or a session-mode pooler"
            ),
        )),
    }
}

/// `%XX` escapes of a URL query value decoded (a path may need them); anything malformed is
/// kept as written.
fn percent_decode(value: &str) -> String {
    let bytes = value.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        match (
            bytes[i],
            bytes.get(i + 1).copied().and_then(hex),
            bytes.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(hi), Some(lo)) => {
                out.push(u8::try_from(hi * 16 + lo).unwrap_or(b'?'));
                i += 3;
            }
            (b, _, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_parse_and_hide_the_password() {
        let t = Target::parse(
            "postgresql://alice:s3cret@db.example:6543/app?schema=t1",
            None,
        )
        .unwrap();
        assert_eq!(t.schema, "t1");
        assert_eq!(t.server, "db.example:6543");
        assert!(!t.label.contains("s3cret"), "{}", t.label);
        let t = Target::parse("postgresql://bob@h/d", Some("tenant_a")).unwrap();
        assert_eq!(t.schema, "tenant_a");
        assert!(Target::parse("postgresql://bob@h/d?schema=a", Some("b")).is_err());
        assert!(Target::parse("postgresql://bob@h/d?schema=Bad-Name", None).is_err());
        assert!(Target::parse("postgresql://bob@h/d?schema=pg_catalog", None).is_err());
        assert_eq!(
            Target::parse("postgresql://bob@h/d", None).unwrap().schema,
            "public"
        );
        // Several hosts, each with its port (the default where a host gives none): all named.
        let t = Target::parse(
            "postgresql://bob:pw@a:5432,b:5433/d?target_session_attrs=read-write",
            None,
        )
        .unwrap();
        assert_eq!(t.server, "a:5432,b:5433");
        assert_eq!(t.label, "postgresql://bob@a:5432,b:5433/d?schema=public");
        assert_eq!(
            t.config.get_target_session_attrs(),
            tokio_postgres::config::TargetSessionAttrs::ReadWrite
        );
        let t = Target::parse("postgresql://bob@a,b:6000/d", None).unwrap();
        assert_eq!(t.server, "a:5432,b:6000");
        assert_eq!(
            Target::parse("postgresql://bob@h/d", None).unwrap().server,
            "h:5432"
        );
    }

    #[test]
    fn the_pooler_mode_parses_and_is_named() {
        let t = Target::parse(
            "postgresql://bob@h:6432/d?pooler=transaction&schema=s",
            None,
        )
        .unwrap();
        assert!(t.pooled);
        assert_eq!(
            t.label,
            "postgresql://bob@h:6432/d?schema=s&pooler=transaction"
        );
        assert!(
            !Target::parse("postgresql://bob@h/d?pooler=session", None)
                .unwrap()
                .pooled
        );
        assert!(!Target::parse("postgresql://bob@h/d", None).unwrap().pooled);
        let Err(err) = Target::parse("postgresql://bob@h/d?pooler=statement", None) else {
            panic!("pooler=statement was accepted");
        };
        assert!(
            matches!(&err, LedgerError::InvalidArgument { argument, message }
                if argument == "target" && message.contains("pooler=transaction")),
            "{err:?}"
        );
    }

    #[test]
    fn percent_escapes_decode_and_malformed_ones_stay() {
        assert_eq!(percent_decode("%2Fetc%2fca.pem"), "/etc/ca.pem");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%zz"), "%zz");
    }
}
