//! `EUDP_*` environment values as a user types them: validation never
//! panics, a value its setting accepts parses, and an unknown name's
//! suggestion is a real setting.
#![no_main]

use eudp_engine::settings;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (name, value) = text.split_once('=').unwrap_or((&text, ""));
    let env = [(name.to_string(), value.to_string())];
    let problems = settings::validate(env.iter().map(|(k, v)| (k.as_str(), v.as_str())), &[]);
    if !name.starts_with("EUDP_") {
        assert!(problems.is_empty(), "only EUDP_ names are checked");
        return;
    }
    match settings::find(name) {
        Some(s) => assert_eq!(problems.is_empty(), s.check(value).is_ok()),
        None => {
            assert_eq!(problems.len(), 1, "an unknown name is one problem");
            if let Some(n) = settings::nearest(name) {
                assert!(settings::find(n).is_some(), "suggested {n} is no setting");
            }
        }
    }
    // Every known name with this value: validation agrees with the setting's own check.
    for s in settings::SETTINGS {
        let one = settings::validate([(s.name, value)], &[]);
        assert_eq!(one.is_empty(), s.check(value).is_ok(), "{}={value:?}", s.name);
    }
});
