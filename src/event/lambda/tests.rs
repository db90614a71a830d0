//! The event's reading against `aws_lambda_events`' own: the same texts taken and refused, with
//! the same messages, and the service's reading against the whole one.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use proptest::prelude::*;

use super::*;

/// What `aws_lambda_events` makes of a payload's text: its bytes, or its error's message.
fn as_aws_lambda_events_reads(text: &str) -> Result<Vec<u8>, String> {
    STANDARD.decode(text).map_err(|error| error.to_string())
}

/// Texts near the edges of base64: each character of the alphabet and beyond it, padding
/// in and out of place, and the bits a canonical encoding leaves at zero.
fn near_base64() -> impl Strategy<Value = String> {
    let encoded = prop::collection::vec(any::<u8>(), 0..48).prop_map(|data| STANDARD.encode(data));
    prop_oneof![
        encoded.clone(),
        "[A-Za-z0-9+/=]{0,24}",
        "[A-Za-z0-9+/=_\\- \n\r\t.!\"é]{0,24}",
        (
            encoded,
            any::<prop::sample::Index>(),
            "[A-Za-z0-9+/=_\\- é]|"
        )
            .prop_map(|(text, at, with)| {
                let mut chars: Vec<char> = text.chars().collect();
                if chars.is_empty() {
                    return with;
                }
                let at = at.index(chars.len());
                match with.chars().next() {
                    Some(with) => chars[at] = with,
                    None => {
                        chars.truncate(at);
                    }
                }
                chars.into_iter().collect()
            }),
    ]
}

proptest! {
    #[test]
    fn the_fast_decoder_takes_and_refuses_the_texts_aws_lambda_events_does(
        text in near_base64()
    ) {
        let fast = base64_simd::STANDARD.decode_to_vec(&text).ok();
        prop_assert_eq!(fast, as_aws_lambda_events_reads(&text).ok(), "{:?}", text);
    }

    #[test]
    fn a_payload_reads_as_aws_lambda_events_reads_it_with_the_same_message(
        text in near_base64()
    ) {
        let ours = decode_base64(text.as_bytes()).map_err(|error| error.to_string());
        prop_assert_eq!(ours, as_aws_lambda_events_reads(&text), "{:?}", text);
    }
}

#[test]
fn non_canonical_padding_and_trailing_bits_are_refused_as_aws_lambda_events_refuses_them() {
    // "QQ==" is "A"; "QR==" sets bits a canonical encoding leaves at zero; "QQ", "QQ=",
    // "aA" (what a lenient decoder takes, found by the property tests) and "QUJDRA=" lack
    // padding; "QUJD=" has one too many; the rest put it where no text
    // can end or continue.
    for text in [
        "QR==", "QQ", "QQ=", "aA", "QUJD=", "QUJDRA=", "Q===", "====", "QQ==QQ==",
    ] {
        assert!(as_aws_lambda_events_reads(text).is_err(), "{text}");
        assert!(base64_simd::STANDARD.decode_to_vec(text).is_err(), "{text}");
        assert_eq!(
            decode_base64(text.as_bytes()).map_err(|e| e.to_string()),
            as_aws_lambda_events_reads(text),
            "{text}"
        );
    }
    assert_eq!(decode_base64(b"QQ==").unwrap(), b"A");
    assert_eq!(decode_base64(b"").unwrap(), b"");
}

#[test]
fn a_payload_that_is_not_base64_fails_the_event_with_aws_lambda_events_message() {
    let event = |data: &str| {
        format!(
            r#"{{"Records":[{{"kinesis":{{"sequenceNumber":"1","data":{data},
            "approximateArrivalTimestamp":1}}}}]}}"#
        )
    };
    for data in [r#""not base64!""#, r#""QUJD=""#, r#""é""#, "null", "17"] {
        let ours = serde_json::from_str::<LambdaKinesisEvent>(&event(data)).map(|e| e.0);
        let theirs = serde_json::from_str::<KinesisEvent>(&event(data));
        assert_eq!(
            ours.map_err(|e| e.to_string()),
            theirs.map_err(|e| e.to_string()),
            "{data}"
        );
    }
    // An array is refused with the same words, its column the first element's rather than
    // the bracket's: the payload is read as bytes, which `serde_json` may read from an
    // array, and the array is refused once opened.
    let ours = serde_json::from_str::<LambdaKinesisEvent>(&event("[1,2]")).unwrap_err();
    let theirs = serde_json::from_str::<KinesisEvent>(&event("[1,2]")).unwrap_err();
    assert_eq!(
        ours.to_string(),
        theirs.to_string().replace("column 52", "column 53")
    );
    assert_eq!(
        theirs.column(),
        52,
        "the bracket's column, as the test expects"
    );

    let LambdaKinesisEvent(event) = serde_json::from_str(&event(r#""aGk=""#)).unwrap();
    assert_eq!(event.records[0].kinesis.data.0, b"hi");
}

#[test]
fn the_service_reading_drops_only_unread_fields_and_refuses_what_the_whole_reading_refuses() {
    let unread = [
        ("awsRegion", false),
        ("eventName", false),
        ("eventSource", false),
        ("eventVersion", false),
        ("invokeIdentityArn", false),
        ("kinesisSchemaVersion", true),
    ];
    let event = |field: &str, value: &str, in_kinesis: bool| {
        let field = format!(r#""{field}":{value}"#);
        let (outer, inner) = if in_kinesis {
            (String::new(), format!(",{field}"))
        } else {
            (format!("{field},"), String::new())
        };
        format!(
            r#"{{"Records":[{{{outer}"eventID":"shardId-0:1","eventSourceARN":"arn","kinesis":
            {{"sequenceNumber":"1","partitionKey":"k","data":"aGk=",
            "approximateArrivalTimestamp":1{inner}}}}}]}}"#
        )
    };
    for (field, in_kinesis) in unread {
        // A text, an escaped one, `null`, four other types, and the field twice.
        let twice = format!(r#""x","{field}":"y""#);
        let values = [
            r#""a text""#,
            r#""\u0041""#,
            "null",
            "17",
            "true",
            "[]",
            "{}",
        ];
        for value in values.into_iter().chain([twice.as_str()]) {
            let json = event(field, value, in_kinesis);
            let whole = serde_json::from_str::<LambdaKinesisEvent>(&json);
            let read = serde_json::from_str::<InvocationEvent>(&json);
            match (whole, read) {
                (Ok(LambdaKinesisEvent(whole)), Ok(InvocationEvent(read))) => {
                    let (whole, read) = (&whole.records[0], &read.records[0]);
                    assert_eq!(read.aws_region, None, "{json}");
                    assert_eq!(read.event_name, None, "{json}");
                    assert_eq!(read.event_source, None, "{json}");
                    assert_eq!(read.event_version, None, "{json}");
                    assert_eq!(read.invoke_identity_arn, None, "{json}");
                    assert_eq!(read.kinesis.kinesis_schema_version, None, "{json}");
                    assert_eq!(read.event_id, whole.event_id, "{json}");
                    assert_eq!(read.event_source_arn, whole.event_source_arn, "{json}");
                    let mut expected = whole.kinesis.clone();
                    expected.kinesis_schema_version = None;
                    assert_eq!(read.kinesis, expected, "{json}");
                }
                (Err(whole), Err(read)) => {
                    assert_eq!(read.to_string(), whole.to_string(), "{json}");
                }
                (whole, read) => panic!("{json}: {whole:?} against {read:?}"),
            }
        }
    }
}

#[test]
fn a_payload_is_read_with_its_escapes_and_a_text_that_is_not_utf8_is_refused() {
    let event = |data: &[u8]| {
        let mut event = br#"{"Records":[{"kinesis":{"sequenceNumber":"1","data":""#.to_vec();
        event.extend_from_slice(data);
        event.extend_from_slice(br#"","approximateArrivalTimestamp":1}}]}"#);
        event
    };
    // JSON may escape any character: "QQ==" written with its padding escaped is still "A".
    let LambdaKinesisEvent(read) = serde_json::from_slice(&event(br"QQ\u003d\u003d")).unwrap();
    assert_eq!(read.records[0].kinesis.data.0, b"A");
    assert_eq!(
        serde_json::from_slice::<KinesisEvent>(&event(br"QQ\u003d\u003d"))
            .unwrap()
            .records[0]
            .kinesis
            .data
            .0,
        b"A"
    );
    // Bytes that are not UTF-8 (Lambda sends none): refused by the decoder, not the parser.
    let refused = serde_json::from_slice::<LambdaKinesisEvent>(&event(b"QQ\xff=")).unwrap_err();
    assert!(
        refused.to_string().contains("Invalid symbol 255"),
        "{refused}"
    );
    assert!(serde_json::from_slice::<KinesisEvent>(&event(b"QQ\xff=")).is_err());
}
