//! The VFS the ledger opens its SQLite files through: the platform's own, except that a
//! commit's write-ahead log frames reach the kernel in one write.
//!
//! SQLite writes each WAL frame as two `pwrite`s, its 24-byte header and its page, so a commit
//! of eight pages is sixteen system calls. Measured with perf on a dispatcher's reserve +
//! finish one call at a time, those writes were about a third of the process's CPU: each goes
//! through the file system's write path for a few bytes. Here a WAL file's writes that follow
//! one another in the file are gathered in memory and handed over in one `pwrite` when the
//! commit's last frame is written, so a commit costs one system call for its frames however
//! many pages it touched.
//!
//! What must hold, and why it does:
//! - *Nothing reads a frame before it is written.* Another connection reads frames only up to
//!   the end its snapshot of the WAL index header names, and SQLite publishes that header only
//!   after `walFrames` wrote the commit's frames. Nothing of a commit is still gathered by
//!   then: its commit frame (whose header carries the database size, nonzero only on a commit)
//!   is written as soon as its page is gathered, and a frame written a second time (a page
//!   that changed again after it spilled, the checksums SQLite rewrites after the commit frame)
//!   goes straight through, after what was gathered. The publication goes through this
//!   database's `xShmBarrier`, which flushes its WAL once more in case a path does otherwise.
//!   This connection's own reads, size queries, truncations and syncs of the WAL flush first.
//! - *A commit that returned is in the kernel*, as with the platform's VFS: a `kill -9` after
//!   it loses nothing (`synchronous=NORMAL` promises no more; `FULL` syncs, and a sync
//!   flushes first).
//! - *A failed write is reported by the call that made it*, and its bytes are dropped: the
//!   commit frame's flush is inside SQLite's own write of it, so `SQLITE_FULL` or an I/O error
//!   fails the commit as it would have, and SQLite rolls it back.
//! - *Nothing uncommitted reaches the file after the transaction.* A rolled-back transaction
//!   may leave spilled frames gathered; they are dropped when its write lock is released, since
//!   the next writer (another connection or process) appends at those same offsets.
//! - Writes that do not follow the gathered ones flush what is gathered first, so the file
//!   sees every write in SQLite's order.
//!
//! Every other file (temporary files) keeps the platform's methods; the database passes every
//! call on but for `xShmBarrier`, `xShmLock` (the write lock's) and `xClose`, which know its
//! WAL. A database and its WAL are matched by the file name SQLite hands both opens
//! (`sqlite3_filename_database` of the WAL's name is the database's name pointer).

use std::ffi::{c_int, c_void, CStr};
use std::ptr;
use std::sync::{Mutex, OnceLock};

use rusqlite::ffi;

/// The name the ledger's connections open with.
pub const NAME: &CStr = c"fencepost";

/// A WAL frame's header, before its page.
const FRAME_HEADER: usize = 24;
/// The WAL file's header, at its start: written when a log begins.
const WAL_HEADER: usize = 32;
/// The shared-memory lock slot of the WAL's one writer (SQLite's `WAL_WRITE_LOCK`).
const WRITE_LOCK: c_int = 0;
/// Gathered bytes past this are written at once: a transaction larger than the page cache
/// spills frames before its commit, and memory stays bounded.
const FLUSH_AT: usize = 4 << 20;
/// What a WAL keeps allocated between commits.
const KEEP: usize = 64 << 10;
/// The most one platform write is handed: the unix VFS writes an amount modulo 128 KiB per
/// system call (`nBuf &= 0x1ffff`), so 128 KiB exactly would write nothing and read as a full
/// disk.
const WRITE_AT_MOST: usize = 64 << 10;

/// What a file opened through this VFS is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Db,
    Wal,
}

/// Kept after the platform's own file struct, in the same allocation SQLite made.
struct Extra {
    /// The platform's methods for this file.
    inner: *const ffi::sqlite3_io_methods,
    kind: Kind,
    /// Db: its name pointer (the key of `DATABASES`). Wal: unused.
    name: usize,
    /// Db: its WAL while open. Wal: its database, while open.
    peer: *mut ffi::sqlite3_file,
    /// Wal: the gathered writes, which start at `start` in the file.
    buf: Vec<u8>,
    start: i64,
    /// Wal: the end of the furthest write of the transaction that holds the write lock (or of
    /// its log, begun since): a write below it writes a frame again.
    high: i64,
    /// Wal: the last write gathered was a commit frame's header (its page comes next).
    commit_frame: bool,
    /// The writes handed to the platform, the database's as well as the WAL's (the tests read
    /// a WAL's).
    writes: u64,
}

struct Vfs {
    /// The platform's VFS.
    base: *mut ffi::sqlite3_vfs,
    /// Where `Extra` starts in a file struct.
    extra_at: usize,
}

// SAFETY: both pointers are to structs SQLite keeps for the life of the process (the
// platform's VFS) and never change after registration.
unsafe impl Send for Vfs {}
unsafe impl Sync for Vfs {}

static VFS: OnceLock<Option<Vfs>> = OnceLock::new();

/// Open databases as (name pointer, file struct), so a WAL's open finds its database's file
/// struct. A few entries, one per open connection: a list.
static DATABASES: Mutex<Vec<(usize, usize)>> = Mutex::new(Vec::new());

fn databases() -> std::sync::MutexGuard<'static, Vec<(usize, usize)>> {
    DATABASES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Register the VFS (once, not as the default). `false` if SQLite has no default VFS to build
/// on or refused it; the caller then opens with the default.
pub fn register() -> bool {
    VFS.get_or_init(|| {
        // SAFETY: sqlite3_vfs_find and sqlite3_vfs_register are thread-safe (they initialize
        // SQLite and take its mutex); the struct registered is leaked, so it outlives every
        // connection, as SQLite requires.
        unsafe {
            let base = ffi::sqlite3_vfs_find(ptr::null());
            if base.is_null() {
                return None;
            }
            let size = usize::try_from((*base).szOsFile).ok()?;
            let extra_at = size.next_multiple_of(std::mem::align_of::<Extra>());
            let mut vfs = *base;
            vfs.szOsFile = c_int::try_from(extra_at + std::mem::size_of::<Extra>()).ok()?;
            vfs.zName = NAME.as_ptr();
            vfs.pNext = ptr::null_mut();
            vfs.pAppData = ptr::null_mut();
            vfs.xOpen = Some(open);
            let vfs = Box::leak(Box::new(vfs));
            // The global is set before the VFS can be found by name, so `open` always sees it.
            if ffi::sqlite3_vfs_register(vfs, 0) != ffi::SQLITE_OK {
                return None;
            }
            Some(Vfs { base, extra_at })
        }
    })
    .is_some()
}

fn vfs() -> &'static Vfs {
    // `open` is reachable only through the registered VFS, after `register` set this.
    VFS.get()
        .and_then(Option::as_ref)
        .expect("the fencepost VFS is registered before use")
}

// SQLite's allocations are 8-byte aligned, and nothing in `Extra` asks for more.
const _: () = assert!(std::mem::align_of::<Extra>() <= 8);

/// Where a file struct's `Extra` is: `extra_at` is a multiple of its alignment, and SQLite
/// allocates file structs aligned to 8 bytes (its allocator's promise), which is `Extra`'s.
fn extra_ptr(f: *mut ffi::sqlite3_file) -> *mut Extra {
    #[allow(clippy::cast_ptr_alignment)]
    f.cast::<u8>().wrapping_add(vfs().extra_at).cast::<Extra>()
}

/// # Safety
/// `f` is a file struct this VFS opened and wrapped (its methods are `METHODS`).
unsafe fn extra<'a>(f: *mut ffi::sqlite3_file) -> &'a mut Extra {
    // SAFETY: the caller's promise: `open` wrote an `Extra` there.
    unsafe { &mut *extra_ptr(f) }
}

/// # Safety
/// As [`extra`].
unsafe fn inner<'a>(f: *mut ffi::sqlite3_file) -> &'a ffi::sqlite3_io_methods {
    // SAFETY: `inner` is the platform's static methods table.
    unsafe { &*extra(f).inner }
}

unsafe extern "C" fn open(
    _vfs: *mut ffi::sqlite3_vfs,
    name: ffi::sqlite3_filename,
    f: *mut ffi::sqlite3_file,
    flags: c_int,
    out_flags: *mut c_int,
) -> c_int {
    let v = vfs();
    // SAFETY: the platform's open on the same struct (it is at least its `szOsFile` long);
    // its name and flags as SQLite gave them.
    let rc = unsafe { ((*v.base).xOpen.expect("a VFS opens"))(v.base, name, f, flags, out_flags) };
    let kind = if flags & ffi::SQLITE_OPEN_MAIN_DB != 0 && !name.is_null() {
        Kind::Db
    } else if flags & ffi::SQLITE_OPEN_WAL != 0 && !name.is_null() {
        Kind::Wal
    } else {
        return rc;
    };
    // SAFETY: reading the methods the platform's open set.
    let methods = unsafe { (*f).pMethods };
    // SAFETY: a methods table the platform's open set, when it set one.
    if rc != ffi::SQLITE_OK || methods.is_null() || unsafe { (*methods).iVersion } < 3 {
        // Left as the platform made it (SQLite closes it with the platform's methods), and so
        // is a platform without shared memory or mapped reads, which `METHODS` would promise.
        return rc;
    }
    let mut e = Extra {
        inner: methods,
        kind,
        name: 0,
        peer: ptr::null_mut(),
        buf: Vec::new(),
        start: 0,
        high: 0,
        commit_frame: false,
        writes: 0,
    };
    let mut dbs = databases();
    match kind {
        Kind::Db => {
            e.name = name as usize;
            dbs.push((e.name, f as usize));
        }
        Kind::Wal => {
            // SAFETY: `name` is a WAL file name SQLite passed to xOpen, which is what
            // sqlite3_filename_database accepts.
            let db = unsafe { ffi::sqlite3_filename_database(name) } as usize;
            if let Some(&(_, db)) = dbs.iter().find(|(name, _)| *name == db) {
                e.peer = db as *mut ffi::sqlite3_file;
            }
        }
    }
    // SAFETY: `extra_at` is within the allocation (szOsFile counts it) and aligned for
    // `Extra`; the bytes there are uninitialized, so written without reading or dropping.
    unsafe {
        ptr::write(extra_ptr(f), e);
        (*f).pMethods = &raw const METHODS;
        if kind == Kind::Wal {
            let peer = extra(f).peer;
            if !peer.is_null() {
                extra(peer).peer = f;
            }
        }
    }
    drop(dbs);
    rc
}

/// The platform's write of `bytes` at `offset` of `f`, counted.
///
/// # Safety
/// `f` is the wrapped file whose `Extra` is `e`.
unsafe fn write_through(
    f: *mut ffi::sqlite3_file,
    e: &mut Extra,
    bytes: &[u8],
    offset: i64,
) -> c_int {
    let Ok(n) = c_int::try_from(bytes.len()) else {
        return ffi::SQLITE_IOERR_WRITE;
    };
    e.writes += 1;
    // SAFETY: the platform's write of `n` bytes the caller holds.
    unsafe { ((*e.inner).xWrite.expect("a file writes"))(f, bytes.as_ptr().cast(), n, offset) }
}

/// Hand the gathered writes to the platform. On failure they are dropped and the error
/// returned: SQLite fails the transaction that wrote them and rolls it back, and bytes kept
/// would reach the file later, over frames another writer put there since.
///
/// # Safety
/// `f` is the WAL file whose `Extra` is `e`.
unsafe fn flush(f: *mut ffi::sqlite3_file, e: &mut Extra) -> c_int {
    let buf = std::mem::take(&mut e.buf);
    let mut rc = ffi::SQLITE_OK;
    let mut at = 0;
    while at < buf.len() && rc == ffi::SQLITE_OK {
        let chunk = &buf[at..buf.len().min(at + WRITE_AT_MOST)];
        #[allow(clippy::cast_possible_wrap)] // at most FLUSH_AT plus one write
        let offset = e.start + at as i64;
        // SAFETY: the caller's promise.
        rc = unsafe { write_through(f, e, chunk, offset) };
        at += chunk.len();
    }
    e.buf = buf;
    discard(e);
    rc
}

/// Drop what is gathered. A transaction past the page cache gathers up to `FLUSH_AT`; a
/// commit's frames are a few KiB, and the connection keeps no more than that between commits.
fn discard(e: &mut Extra) {
    e.buf.clear();
    e.buf.shrink_to(KEEP);
}

unsafe extern "C" fn x_write(
    f: *mut ffi::sqlite3_file,
    data: *const c_void,
    amt: c_int,
    offset: i64,
) -> c_int {
    // SAFETY: SQLite calls this only on files `open` wrapped.
    let e = unsafe { extra(f) };
    let Ok(len) = usize::try_from(amt) else {
        return ffi::SQLITE_IOERR_WRITE;
    };
    // SAFETY: SQLite's buffer of `amt` bytes.
    let bytes = unsafe { std::slice::from_raw_parts(data.cast::<u8>(), len) };
    if e.kind != Kind::Wal {
        // SAFETY: passed on as SQLite made the call.
        return unsafe { write_through(f, e, bytes, offset) };
    }
    let end = offset + i64::from(amt);
    if offset == 0 && len == WAL_HEADER {
        // A new log: its frames follow from here.
        e.high = 0;
    }
    if offset < e.high {
        // A frame of this transaction written again (a page changed after it spilled, the
        // checksums SQLite rewrites after the commit frame): straight through, after what is
        // gathered, so the file sees SQLite's order and this call answers any error. Nothing
        // is left gathered once the commit frame is written.
        // SAFETY: `f` is this WAL.
        let rc = unsafe { flush(f, e) };
        if rc != ffi::SQLITE_OK {
            return rc;
        }
        // SAFETY: as above.
        return unsafe { write_through(f, e, bytes, offset) };
    }
    #[allow(clippy::cast_possible_wrap)] // at most FLUSH_AT plus one write
    let follows = e.start + e.buf.len() as i64 == offset;
    if !e.buf.is_empty() && !follows {
        // SAFETY: `f` is this WAL.
        let rc = unsafe { flush(f, e) };
        if rc != ffi::SQLITE_OK {
            return rc;
        }
    }
    if e.buf.is_empty() {
        e.start = offset;
    }
    e.buf.extend_from_slice(bytes);
    e.high = e.high.max(end);
    let ends_commit = std::mem::take(&mut e.commit_frame);
    // A frame header's bytes 4..8 are the database's size after the commit it ends, zero in
    // every other frame. Kept across a flush for size: the page after it still ends the commit.
    e.commit_frame = len == FRAME_HEADER && bytes[4..8] != [0; 4];
    if ends_commit || e.buf.len() >= FLUSH_AT {
        // SAFETY: `f` is this WAL.
        return unsafe { flush(f, e) };
    }
    ffi::SQLITE_OK
}

/// Flush a WAL before a call that reads or moves its file; any other file passes.
///
/// # Safety
/// `f` is a file this VFS wrapped.
unsafe fn settle(f: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: the caller's promise.
    let e = unsafe { extra(f) };
    if e.kind == Kind::Wal {
        // SAFETY: as above.
        unsafe { flush(f, e) }
    } else {
        ffi::SQLITE_OK
    }
}

/// Methods that read or move a WAL's file: what is gathered is written first.
macro_rules! settled {
    ($name:ident, $field:ident, ($($arg:ident: $ty:ty),*)) => {
        unsafe extern "C" fn $name(f: *mut ffi::sqlite3_file, $($arg: $ty),*) -> c_int {
            // SAFETY: a wrapped file; then the platform's method with SQLite's own arguments.
            unsafe {
                let rc = settle(f);
                if rc != ffi::SQLITE_OK {
                    return rc;
                }
                (inner(f).$field.expect(stringify!($field)))(f, $($arg),*)
            }
        }
    };
}
settled!(x_read, xRead, (data: *mut c_void, amt: c_int, offset: i64));
settled!(x_truncate, xTruncate, (size: i64));
settled!(x_sync, xSync, (flags: c_int));
settled!(x_file_size, xFileSize, (size: *mut i64));
settled!(x_file_control, xFileControl, (op: c_int, arg: *mut c_void));

unsafe extern "C" fn x_close(f: *mut ffi::sqlite3_file) -> c_int {
    // SAFETY: a wrapped file, closed once: its `Extra` is read out (and so dropped here) before
    // the platform closes the struct; its peer, if open, is a wrapped file too.
    unsafe {
        let flushed = settle(f);
        let e = ptr::read(extra_ptr(f));
        let mut dbs = databases();
        if !e.peer.is_null() {
            extra(e.peer).peer = ptr::null_mut();
        }
        if e.kind == Kind::Db {
            dbs.retain(|(name, _)| *name != e.name);
        }
        drop(dbs);
        let rc = ((*e.inner).xClose.expect("a file closes"))(f);
        if flushed == ffi::SQLITE_OK {
            rc
        } else {
            flushed
        }
    }
}

unsafe extern "C" fn x_shm_barrier(f: *mut ffi::sqlite3_file) {
    // SAFETY: a wrapped database; its peer is its open WAL, another struct. By the time SQLite
    // publishes a commit nothing of it is gathered (its commit frame and every frame written
    // again went out with their own writes), so this flush finds nothing: it stands in case a
    // path of SQLite's does otherwise, before the commit can be seen.
    unsafe {
        let e = extra(f);
        if e.kind == Kind::Db && !e.peer.is_null() {
            let _ = flush(e.peer, extra(e.peer));
        }
        if let Some(barrier) = inner(f).xShmBarrier {
            barrier(f);
        }
    }
}

unsafe extern "C" fn x_shm_lock(
    f: *mut ffi::sqlite3_file,
    offset: c_int,
    n: c_int,
    flags: c_int,
) -> c_int {
    // SAFETY: a wrapped database; its peer is its open WAL, another struct.
    unsafe {
        let e = extra(f);
        let mut wal = (e.kind == Kind::Db
            && !e.peer.is_null()
            && (offset..offset + n).contains(&WRITE_LOCK)
            && flags & ffi::SQLITE_SHM_EXCLUSIVE != 0)
            .then(|| extra(e.peer));
        if flags & ffi::SQLITE_SHM_UNLOCK != 0 {
            if let Some(w) = wal.as_deref_mut() {
                // The write transaction is over. What is still gathered was never committed
                // (a rolled-back transaction's spilled frames): once another writer may append
                // at those offsets, it must never reach the file.
                discard(w);
                w.commit_frame = false;
            }
        }
        let rc = (inner(f).xShmLock.expect("xShmLock"))(f, offset, n, flags);
        if let Some(w) = wal {
            if rc == ffi::SQLITE_OK && flags & ffi::SQLITE_SHM_LOCK != 0 {
                // A new write transaction: only its own frames are written again.
                w.high = 0;
            }
        }
        rc
    }
}

/// Methods passed on unchanged.
macro_rules! pass {
    ($name:ident, $field:ident, ($($arg:ident: $ty:ty),*) -> $ret:ty) => {
        unsafe extern "C" fn $name(f: *mut ffi::sqlite3_file, $($arg: $ty),*) -> $ret {
            // SAFETY: a wrapped file; the platform's method with SQLite's own arguments.
            unsafe { (inner(f).$field.expect(stringify!($field)))(f, $($arg),*) }
        }
    };
}
pass!(x_lock, xLock, (level: c_int) -> c_int);
pass!(x_unlock, xUnlock, (level: c_int) -> c_int);
pass!(x_check_reserved_lock, xCheckReservedLock, (out: *mut c_int) -> c_int);
pass!(x_sector_size, xSectorSize, () -> c_int);
pass!(x_device_characteristics, xDeviceCharacteristics, () -> c_int);
pass!(x_shm_map, xShmMap, (page: c_int, size: c_int, extend: c_int, out: *mut *mut c_void) -> c_int);
pass!(x_shm_unmap, xShmUnmap, (delete: c_int) -> c_int);
pass!(x_fetch, xFetch, (offset: i64, amt: c_int, out: *mut *mut c_void) -> c_int);
pass!(x_unfetch, xUnfetch, (offset: i64, p: *mut c_void) -> c_int);

/// Version 3, as the platform's (unix) methods are: shared memory and memory-mapped reads.
static METHODS: ffi::sqlite3_io_methods = ffi::sqlite3_io_methods {
    iVersion: 3,
    xClose: Some(x_close),
    xRead: Some(x_read),
    xWrite: Some(x_write),
    xTruncate: Some(x_truncate),
    xSync: Some(x_sync),
    xFileSize: Some(x_file_size),
    xLock: Some(x_lock),
    xUnlock: Some(x_unlock),
    xCheckReservedLock: Some(x_check_reserved_lock),
    xFileControl: Some(x_file_control),
    xSectorSize: Some(x_sector_size),
    xDeviceCharacteristics: Some(x_device_characteristics),
    xShmMap: Some(x_shm_map),
    xShmLock: Some(x_shm_lock),
    xShmBarrier: Some(x_shm_barrier),
    xShmUnmap: Some(x_shm_unmap),
    xFetch: Some(x_fetch),
    xUnfetch: Some(x_unfetch),
};

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::{Connection, OpenFlags};

    fn temp_path(name: &str) -> std::path::PathBuf {
        super::super::tests::temp_path(name).into()
    }

    /// A connection through this VFS, in WAL mode with 1 KiB pages and `cache` pages of cache.
    fn open_wal(path: &std::path::Path, cache: i64) -> Connection {
        assert!(register());
        let flags = OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_CREATE;
        let c = Connection::open_with_flags_and_vfs(path, flags, NAME).unwrap();
        c.execute_batch(&format!(
            "PRAGMA page_size = 1024; PRAGMA journal_mode = WAL; PRAGMA synchronous = NORMAL;
             PRAGMA wal_autocheckpoint = 0; PRAGMA cache_size = {cache};
             CREATE TABLE IF NOT EXISTS t (k INTEGER PRIMARY KEY, v TEXT NOT NULL);
             CREATE INDEX IF NOT EXISTS t_v ON t(v);"
        ))
        .unwrap();
        c
    }

    /// The struct SQLite keeps for `main`'s database file (`FILE_POINTER`) or its WAL
    /// (`JOURNAL_POINTER`).
    fn file(c: &Connection, op: c_int) -> *mut ffi::sqlite3_file {
        let mut f: *mut ffi::sqlite3_file = ptr::null_mut();
        // SAFETY: a file control SQLite documents, answered into a pointer of its type.
        let rc = unsafe {
            ffi::sqlite3_file_control(c.handle(), c"main".as_ptr(), op, (&raw mut f).cast())
        };
        assert_eq!(rc, ffi::SQLITE_OK);
        assert!(!f.is_null());
        f
    }

    fn wal_writes(c: &Connection) -> u64 {
        let wal = file(c, ffi::SQLITE_FCNTL_JOURNAL_POINTER);
        // SAFETY: the WAL's methods are checked to be this VFS's before its `Extra` is read.
        unsafe {
            assert!(ptr::eq((*wal).pMethods, &raw const METHODS));
            extra(wal).writes
        }
    }

    /// Insert rows `0..rows` whose values start with `letter`, 200 bytes each.
    fn fill(c: &Connection, rows: i64, letter: char) {
        for i in 0..rows {
            c.execute(
                "INSERT INTO t(k, v) VALUES (?1, printf('%.200c', ?2) || ?1)",
                rusqlite::params![i, letter.to_string()],
            )
            .unwrap();
        }
    }

    /// What a `kill -9` of the writer would leave: the database and its WAL copied while it is
    /// open, opened elsewhere (SQLite recovers the log from the file alone).
    fn copied(path: &std::path::Path, name: &str) -> Connection {
        let copy = temp_path(name);
        std::fs::copy(path, &copy).unwrap();
        let wal = |p: &std::path::Path| format!("{}-wal", p.display());
        std::fs::copy(wal(path), wal(&copy)).unwrap();
        Connection::open(&copy).unwrap()
    }

    fn count(c: &Connection) -> i64 {
        c.query_row("SELECT count(*) FROM t", [], |r| r.get(0))
            .unwrap()
    }

    #[test]
    fn the_ledgers_connections_open_their_database_and_wal_through_it() {
        let path = temp_path("ledger");
        let store = crate::store::sqlite::SqliteStore::open(
            path.to_str(),
            &crate::store::OpenOptions::default(),
            1,
        )
        .unwrap();
        let db = file(&store.conn, ffi::SQLITE_FCNTL_FILE_POINTER);
        // SAFETY: reading the methods pointer of a struct SQLite keeps open.
        assert!(ptr::eq(unsafe { (*db).pMethods }, &raw const METHODS));
        assert!(
            wal_writes(&store.conn) > 0,
            "the migrations' commits went through it"
        );
    }

    #[test]
    fn each_commit_is_one_write_and_is_read_at_once_by_another_connection() {
        let path = temp_path("commits");
        let w = open_wal(&path, 2000);
        let r = Connection::open(&path).unwrap();
        for i in 0..200_i64 {
            let before = wal_writes(&w);
            // Several pages each: the row's leaf, the index's leaf, and more as they split.
            w.execute_batch(&format!(
                "BEGIN IMMEDIATE; INSERT INTO t(k, v) VALUES ({i}, printf('%.300c', 'x') || {i});
                 INSERT INTO t(k, v) VALUES ({i} + 100000, printf('%.300c', 'y') || {i}); COMMIT"
            ))
            .unwrap();
            assert_eq!(
                wal_writes(&w) - before,
                1,
                "commit {i} took one write for its frames"
            );
            assert_eq!(count(&r), 2 * (i + 1));
        }
    }

    /// A rolled-back transaction that spilled leaves nothing to write: another writer then
    /// appends its commit at the same offsets of the log, and this connection's next
    /// transactions (each passing the database's barrier) must not put the spilled frames over
    /// it.
    #[test]
    fn a_rolled_back_spill_never_reaches_the_file_over_another_writers_commit() {
        let path = temp_path("rollback");
        let w = open_wal(&path, 10);
        let other = open_wal(&path, 2000);
        w.execute("INSERT INTO t(k, v) VALUES (-1, 'first')", [])
            .unwrap();
        w.execute_batch("BEGIN IMMEDIATE").unwrap();
        fill(&w, 2_000, 'r');
        w.execute_batch("ROLLBACK").unwrap();
        fill(&other, 300, 'o');
        // Reads and a write of this connection: each passes the barrier and the write lock.
        assert_eq!(count(&w), 301);
        w.execute("INSERT INTO t(k, v) VALUES (-2, 'last')", [])
            .unwrap();
        for c in [&other, &copied(&path, "rollback-copy")] {
            assert_eq!(count(c), 302);
            let spilled: i64 = c
                .query_row("SELECT count(*) FROM t WHERE v LIKE 'r%'", [], |r| r.get(0))
                .unwrap();
            assert_eq!(spilled, 0);
            let check: String = c
                .query_row("PRAGMA integrity_check", [], |r| r.get(0))
                .unwrap();
            assert_eq!(check, "ok");
        }
    }

    /// A transaction larger than the page cache writes frames before its commit and then
    /// overwrites some of them, and SQLite rewrites their checksums after the commit frame:
    /// what the file holds once the commit returned (what a `kill -9` then leaves, copied
    /// while the writer is still open) must recover to every committed row.
    #[test]
    fn a_spilled_transaction_commits_whole_and_recovers_from_the_file_alone() {
        let path = temp_path("spill");
        let w = open_wal(&path, 10);
        let rows = 3_000_i64;
        w.execute_batch("BEGIN IMMEDIATE").unwrap();
        fill(&w, rows, 'a');
        // Pages written out by the spills above change again.
        w.execute("UPDATE t SET v = v || 'z' WHERE k % 7 = 0", [])
            .unwrap();
        w.execute_batch("COMMIT").unwrap();
        let r = Connection::open(&path).unwrap();
        assert_eq!(count(&r), rows);
        let c = copied(&path, "spill-copy");
        assert_eq!(count(&c), rows);
        let z: i64 = c
            .query_row("SELECT count(*) FROM t WHERE v LIKE '%z'", [], |r| r.get(0))
            .unwrap();
        assert_eq!(z, (rows + 6) / 7);
        let check: String = c
            .query_row("PRAGMA integrity_check", [], |r| r.get(0))
            .unwrap();
        assert_eq!(check, "ok");
    }
}
