//! SQLite's own page cache, with one key moved: the page number a B-tree balance parks a page
//! under while it renumbers siblings.
//!
//! When a balance leaves a B-tree's new sibling pages out of ascending order, SQLite swaps
//! their numbers, parking one page for a moment under the number of the page that holds the
//! file's lock bytes (`PENDING_BYTE / page size + 1`: page 1 048 577 at 1 KiB), which no data
//! ever uses. The page cache remembers the largest number it has seen, and every commit ends
//! by dropping the cached pages past the file's end (`sqlite3PcacheTruncate`). That drop looks
//! only at the numbers between the file's end and that largest one, unless they are more than
//! the cache has hash slots: then it walks every slot and every cached page. So after a
//! balance that renumbered, the commit walks the whole cache, each page's header a cache miss
//! of its own. Counted with gdb on a dispatcher's reserve + finish one call at a time, units
//! named as 16 callers name theirs: one commit in twelve did, and perf put the walk at 2.7-3.6%
//! of the process's CPU on a new file. Where the 8 MiB cache is full (200 000 units), taking
//! the walk away made reserve + finish 11% faster one call at a time and 8% in batches of 16.
//!
//! Here every cache is SQLite's default one, created and driven as SQLite would, but the
//! parking number is handed to it as 0, a number no page has (pages count from 1): the page is
//! parked and found again exactly as before, and the cache's largest number stays the file's.
//! The three renumberings of a swap follow one another inside the balance, so no page is ever
//! left under 0 when the cache is next truncated, fetched from by number or destroyed.

use std::ffi::{c_int, c_uint, c_void};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use rusqlite::ffi;

/// SQLite's `PENDING_BYTE`: the offset of the file's lock bytes (a test-only control moves it;
/// nothing here uses that).
const PENDING_BYTE: c_uint = 0x4000_0000;

/// The default page cache's methods, taken before ours replace them.
struct Inner(ffi::sqlite3_pcache_methods2);

// SAFETY: a table of C function pointers and SQLite's own argument pointer for them, written
// once before SQLite initializes and only read after; SQLite calls them from any thread.
unsafe impl Send for Inner {}
unsafe impl Sync for Inner {}

static INNER: OnceLock<Inner> = OnceLock::new();

/// Pages parked under the moved number since the process began (read by the tests, to know
/// that a workload renumbered pages at all).
static PARKED: AtomicU64 = AtomicU64::new(0);

/// One cache: the default cache's handle, and the number its page size parks pages under.
struct Cache {
    inner: *mut ffi::sqlite3_pcache,
    parking: c_uint,
}

fn inner() -> &'static ffi::sqlite3_pcache_methods2 {
    // Our methods are installed only after `INNER` is set (see `install`).
    &INNER
        .get()
        .expect("the default page cache is saved before ours is installed")
        .0
}

/// The largest key handed to a default cache (tests only: it is what the default cache's
/// truncation compares against the file's end).
#[cfg(test)]
static LARGEST: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);

/// The default cache's key for page `key` of `cache`.
fn key(cache: &Cache, key: c_uint) -> c_uint {
    let key = if key == cache.parking { 0 } else { key };
    #[cfg(test)]
    LARGEST.fetch_max(key, Ordering::Relaxed);
    key
}

/// # Safety
/// `p` is a handle `create` returned and `destroy` has not freed: SQLite hands each method
/// only the handles this cache's `create` gave it.
unsafe fn cache<'a>(p: *mut ffi::sqlite3_pcache) -> &'a Cache {
    // SAFETY: the caller's promise; `create` made it from a `Box<Cache>`.
    unsafe { &*p.cast::<Cache>() }
}

// Each method below is called by SQLite as its page cache's: with a handle `create` returned
// (so `cache` holds) and otherwise the arguments the default cache's own method expects, to
// which it passes them on, with that cache's handle and, for a page number, its key.

unsafe extern "C" fn init(arg: *mut c_void) -> c_int {
    // SAFETY: see above.
    unsafe { inner().xInit.map_or(ffi::SQLITE_OK, |f| f(arg)) }
}

unsafe extern "C" fn shutdown(arg: *mut c_void) {
    if let Some(f) = inner().xShutdown {
        // SAFETY: see above.
        unsafe { f(arg) };
    }
}

unsafe extern "C" fn create(
    page_size: c_int,
    extra: c_int,
    purgeable: c_int,
) -> *mut ffi::sqlite3_pcache {
    let Some(f) = inner().xCreate else {
        return std::ptr::null_mut();
    };
    // SAFETY: see above.
    let handle = unsafe { f(page_size, extra, purgeable) };
    if handle.is_null() {
        return handle; // SQLite's out of memory
    }
    // Every handle SQLite gets back is a `Cache` (the other methods read it as one). SQLite
    // asks for no page size below 512; were it to, 0 parks nothing (no page number is 0).
    let parking = c_uint::try_from(page_size)
        .ok()
        .filter(|&size| size > 0)
        .map_or(0, |size| PENDING_BYTE / size + 1);
    Box::into_raw(Box::new(Cache {
        inner: handle,
        parking,
    }))
    .cast()
}

unsafe extern "C" fn cachesize(p: *mut ffi::sqlite3_pcache, n: c_int) {
    if let Some(f) = inner().xCachesize {
        // SAFETY: see above.
        unsafe { f(cache(p).inner, n) };
    }
}

unsafe extern "C" fn pagecount(p: *mut ffi::sqlite3_pcache) -> c_int {
    // SAFETY: see above.
    unsafe { inner().xPagecount.map_or(0, |f| f(cache(p).inner)) }
}

unsafe extern "C" fn fetch(
    p: *mut ffi::sqlite3_pcache,
    k: c_uint,
    create_flag: c_int,
) -> *mut ffi::sqlite3_pcache_page {
    // SAFETY: see above.
    unsafe {
        let c = cache(p);
        inner()
            .xFetch
            .map_or(std::ptr::null_mut(), |f| f(c.inner, key(c, k), create_flag))
    }
}

unsafe extern "C" fn unpin(
    p: *mut ffi::sqlite3_pcache,
    page: *mut ffi::sqlite3_pcache_page,
    discard: c_int,
) {
    if let Some(f) = inner().xUnpin {
        // SAFETY: see above.
        unsafe { f(cache(p).inner, page, discard) };
    }
}

unsafe extern "C" fn rekey(
    p: *mut ffi::sqlite3_pcache,
    page: *mut ffi::sqlite3_pcache_page,
    old: c_uint,
    new: c_uint,
) {
    // SAFETY: see above.
    let c = unsafe { cache(p) };
    if new == c.parking {
        PARKED.fetch_add(1, Ordering::Relaxed);
    }
    if let Some(f) = inner().xRekey {
        // SAFETY: see above.
        unsafe { f(c.inner, page, key(c, old), key(c, new)) };
    }
}

unsafe extern "C" fn truncate(p: *mut ffi::sqlite3_pcache, limit: c_uint) {
    if let Some(f) = inner().xTruncate {
        // SAFETY: see above.
        unsafe { f(cache(p).inner, limit) };
    }
}

unsafe extern "C" fn destroy(p: *mut ffi::sqlite3_pcache) {
    // SAFETY: see above; SQLite destroys each cache once and uses it no more, so the `Box`
    // `create` made is taken back here.
    let c = unsafe { Box::from_raw(p.cast::<Cache>()) };
    if let Some(f) = inner().xDestroy {
        // SAFETY: see above.
        unsafe { f(c.inner) };
    }
}

unsafe extern "C" fn shrink(p: *mut ffi::sqlite3_pcache) {
    if let Some(f) = inner().xShrink {
        // SAFETY: see above.
        unsafe { f(cache(p).inner) };
    }
}

/// Put this cache in place of the default one. Must run before SQLite initializes, from one
/// thread (the caller's `Once`); `false` (the default cache stays) if SQLite refused, which it
/// does once initialized.
pub fn install() -> bool {
    let mut default = ffi::sqlite3_pcache_methods2 {
        iVersion: 0,
        pArg: std::ptr::null_mut(),
        xInit: None,
        xShutdown: None,
        xCreate: None,
        xCachesize: None,
        xPagecount: None,
        xFetch: None,
        xUnpin: None,
        xRekey: None,
        xTruncate: None,
        xDestroy: None,
        xShrink: None,
    };
    // SAFETY: sqlite3_config before sqlite3_initialize, from one thread (the caller's `Once`).
    // GETPCACHE2 fills the struct with the default cache's methods (setting them up first);
    // PCACHE2 copies ours, whose functions reach the default ones through `INNER`, set before.
    unsafe {
        if ffi::sqlite3_config(
            ffi::SQLITE_CONFIG_GETPCACHE2,
            std::ptr::addr_of_mut!(default),
        ) != ffi::SQLITE_OK
            || default.xCreate.is_none()
        {
            return false;
        }
        let ours = ffi::sqlite3_pcache_methods2 {
            iVersion: default.iVersion,
            pArg: default.pArg,
            xInit: Some(init),
            xShutdown: Some(shutdown),
            xCreate: Some(create),
            xCachesize: Some(cachesize),
            xPagecount: Some(pagecount),
            xFetch: Some(fetch),
            xUnpin: Some(unpin),
            xRekey: Some(rekey),
            xTruncate: Some(truncate),
            xDestroy: Some(destroy),
            xShrink: Some(shrink),
        };
        if INNER.set(Inner(default)).is_err() {
            return false;
        }
        ffi::sqlite3_config(ffi::SQLITE_CONFIG_PCACHE2, std::ptr::addr_of!(ours)) == ffi::SQLITE_OK
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::Connection;

    const FRESH: &str = "store::sqlite::pcache::tests::in_a_process_of_its_own";

    /// The page cache goes in before SQLite initializes, which another test in this process
    /// may already have done: the check runs in a process of its own (this test binary again,
    /// running only it).
    #[test]
    fn a_balance_that_renumbers_pages_leaves_the_cache_its_largest_page() {
        let exe = std::env::current_exe().unwrap();
        let out = std::process::Command::new(exe)
            .args(["--ignored", "--exact", FRESH, "--test-threads=1"])
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success() && stdout.contains("1 passed"),
            "{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    #[ignore = "run by a_balance_that_renumbers_pages_leaves_the_cache_its_largest_page, alone"]
    fn in_a_process_of_its_own() {
        super::super::configure_process();
        assert!(INNER.get().is_some(), "the page cache was not installed");
        let path = super::super::tests::temp_path("pcache.db");
        let c = Connection::open(&path).unwrap();
        c.execute_batch(
            "PRAGMA page_size = 1024; PRAGMA journal_mode = WAL;
             CREATE TABLE t (k TEXT PRIMARY KEY, v TEXT NOT NULL) WITHOUT ROWID;",
        )
        .unwrap();
        // Keys in no order, then a third deleted and as many added: balances take pages from
        // the free list, below their siblings, and renumber.
        let key = |i: u64| format!("{:016x}", i.wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let write = |range: std::ops::Range<u64>, keep: fn(u64) -> bool| {
            let tx = c.unchecked_transaction().unwrap();
            for i in range.filter(|&i| keep(i)) {
                tx.execute(
                    "INSERT INTO t VALUES (?1, printf('%.150c', 'v') || ?1)",
                    [key(i)],
                )
                .unwrap();
            }
            tx.commit().unwrap();
        };
        write(0..20_000, |_| true);
        c.execute("DELETE FROM t WHERE substr(k, 16) IN ('0', '5', 'a')", [])
            .unwrap();
        let before = PARKED.load(Ordering::Relaxed);
        for start in (20_000..40_000).step_by(100) {
            write(start..start + 100, |_| true);
        }
        assert!(
            PARKED.load(Ordering::Relaxed) > before,
            "the inserts renumbered no page, so they test nothing"
        );
        let pages: u32 = c.query_row("PRAGMA page_count", [], |r| r.get(0)).unwrap();
        let largest = LARGEST.load(Ordering::Relaxed);
        assert!(
            largest <= pages,
            "the default cache was handed page {largest}, past the file's {pages}"
        );
        let check: String = c
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(check, "ok");
        let (rows, wrong): (i64, i64) = c
            .query_row(
                "SELECT count(*), count(*) FILTER (WHERE v <> printf('%.150c', 'v') || k) FROM t",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .unwrap();
        let deleted = (0..20_000_u64)
            .filter(|&i| matches!(key(i).as_bytes()[15], b'0' | b'5' | b'a'))
            .count();
        assert_eq!(rows, i64::try_from(40_000 - deleted).unwrap());
        assert_eq!(wrong, 0);
    }
}
