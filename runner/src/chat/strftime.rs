//! `strftime_now(format)` of transformers' chat-template environment
//! (`datetime.now().strftime(format)`, used by e.g. Llama 3 templates for "Today Date"), with a
//! small strftime subset and UTC in place of the local time zone.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

const DAYS: [&str; 7] = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"];
const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];

/// The template function: the current UTC time formatted by [`strftime`].
pub fn strftime_now(format: String) -> Result<String, minijinja::Error> {
    let secs = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0);
    strftime(&format, secs).map_err(|e| minijinja::Error::new(minijinja::ErrorKind::InvalidOperation, e))
}

/// The proleptic Gregorian (year, month 1-12, day 1-31) of a day count since 1970-01-01
/// (H. Hinnant's `civil_from_days`).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

fn is_leap(y: i64) -> bool {
    y % 4 == 0 && (y % 100 != 0 || y % 400 == 0)
}

/// Formats `secs` (seconds since the Unix epoch, UTC) like Python's `strftime` on a naive
/// datetime. Directives: `%Y %y %m %B %b %h %d %e %j %A %a %u %w %H %I %M %S %p %F %T %D %R %Z %z
/// %%` (`%Z` and `%z` are empty, as for a naive datetime), and glibc's `-` flag (`%-d`: no
/// padding). Any other directive is an error naming it.
pub fn strftime(format: &str, secs: i64) -> Result<String, String> {
    let days = secs.div_euclid(86_400);
    let tod = secs.rem_euclid(86_400);
    let (y, m, d) = civil_from_days(days);
    let (hh, mm, ss) = (tod / 3600, tod / 60 % 60, tod % 60);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday; 0 = Monday
    const CUM: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let yday = CUM[(m - 1) as usize] + d + u32::from(m > 2 && is_leap(y));
    let hour12 = if hh % 12 == 0 { 12 } else { hh % 12 };
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut spec = chars.next().ok_or("strftime: the format ends with a lone `%`")?;
        let pad = spec != '-';
        if !pad {
            spec = chars.next().ok_or("strftime: the format ends with `%-`")?;
        }
        let num = |out: &mut String, v: i64, width: usize| {
            let _ = if pad { write!(out, "{v:0width$}") } else { write!(out, "{v}") };
        };
        match spec {
            'Y' => num(&mut out, y, 4),
            'y' => num(&mut out, y.rem_euclid(100), 2),
            'm' => num(&mut out, i64::from(m), 2),
            'd' => num(&mut out, i64::from(d), 2),
            'e' if pad => {
                let _ = write!(out, "{d:2}");
            }
            'e' => num(&mut out, i64::from(d), 2),
            'j' => num(&mut out, i64::from(yday), 3),
            'H' => num(&mut out, hh, 2),
            'I' => num(&mut out, hour12, 2),
            'M' => num(&mut out, mm, 2),
            'S' => num(&mut out, ss, 2),
            'u' => num(&mut out, weekday as i64 + 1, 1),
            'w' => num(&mut out, (weekday as i64 + 1) % 7, 1),
            'B' => out.push_str(MONTHS[(m - 1) as usize]),
            'b' | 'h' => out.push_str(&MONTHS[(m - 1) as usize][..3]),
            'A' => out.push_str(DAYS[weekday]),
            'a' => out.push_str(&DAYS[weekday][..3]),
            'p' => out.push_str(if hh < 12 { "AM" } else { "PM" }),
            'F' => {
                let _ = write!(out, "{y:04}-{m:02}-{d:02}");
            }
            'T' => {
                let _ = write!(out, "{hh:02}:{mm:02}:{ss:02}");
            }
            'R' => {
                let _ = write!(out, "{hh:02}:{mm:02}");
            }
            'D' => {
                let _ = write!(out, "{m:02}/{d:02}/{:02}", y.rem_euclid(100));
            }
            'Z' | 'z' => {}
            '%' => out.push('%'),
            other => return Err(format!("strftime_now: the directive `%{other}` is not supported")),
        }
    }
    Ok(out)
}
