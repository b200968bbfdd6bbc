//! Profile files as a user writes them (`eudp run --profile-file`): parsing
//! never panics, every profile of a file that parses resolves, and the file
//! written back parses to the same profiles with the same settings.
#![no_main]

use eudp_cli::profiles::{resolve, ProfileFile};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let Ok(file) = ProfileFile::parse(&text, "fuzz.toml") else {
        return;
    };
    let written = file.to_toml();
    let again = ProfileFile::parse(&written, "fuzz.toml")
        .unwrap_or_else(|e| panic!("written back, the file does not parse: {e}\n{written}"));
    assert_eq!(file, again, "written back, the profiles differ:\n{written}");
    for name in file.names() {
        let settings = resolve(name, Some(&file)).unwrap_or_else(|e| panic!("{name:?} parsed but does not resolve: {e}"));
        assert_eq!(Ok(&settings), resolve(name, Some(&again)).as_ref(), "{name:?} resolves differently written back");
    }
});
