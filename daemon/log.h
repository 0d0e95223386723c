/*
 * log.h - sm70d's log: one line per event worth logging, on stderr, with a level.
 *
 * Under systemd (JOURNAL_STREAM set) each line starts with the "<N>" priority prefix that
 * journald understands; otherwise with "sm70d: LEVEL: ". Non-goals: files, rotation, syslog.
 * Single-threaded like the rest of the daemon.
 */
#ifndef SM70_DAEMON_LOG_H
#define SM70_DAEMON_LOG_H

enum sm70__log_level {
	SM70__LOG_ERR = 3,
	SM70__LOG_WARN = 4,
	SM70__LOG_NOTICE = 5,
	SM70__LOG_INFO = 6,
	SM70__LOG_DEBUG = 7,
};

/* Lines above this level are dropped (default INFO). */
void sm70__log_set_level(int level);

void sm70__log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define sm70__err(...) sm70__log(SM70__LOG_ERR, __VA_ARGS__)
#define sm70__warn(...) sm70__log(SM70__LOG_WARN, __VA_ARGS__)
#define sm70__notice(...) sm70__log(SM70__LOG_NOTICE, __VA_ARGS__)
#define sm70__info(...) sm70__log(SM70__LOG_INFO, __VA_ARGS__)
#define sm70__debug(...) sm70__log(SM70__LOG_DEBUG, __VA_ARGS__)

#endif
