//! The SDK's blob helpers against a real server: up, down whole and in
//! part, by reference; another tenant's reference is refused.

use narad_client::{Client, ClientError};
use narad_server::auth::Role;
use narad_tests::{Server, open_session, token};

#[tokio::test]
async fn a_blob_goes_up_and_comes_back_by_reference() {
    let s = Server::start().await;
    let t = token("acme", &[Role::Writer, Role::Reader, Role::Backend]);
    open_session(&s, &t, "a").await;
    // The first replica is down: the SDK goes on to the next.
    let client = Client::new(vec!["http://127.0.0.1:9".into(), s.base.clone()], t);
    let bytes: Vec<u8> = (0..2_500_000u32).map(|i| (i % 253) as u8).collect();
    let blob = client
        .upload_blob("a", bytes.clone(), "data.bin", "application/octet-stream")
        .await
        .unwrap();
    let uri = blob["uri"].as_str().unwrap();
    assert!(uri.starts_with(narad_client::blobs::BLOB_REFERENCE));
    assert_eq!(blob["sizeBytes"], bytes.len());
    assert_eq!(client.download_blob(uri, None).await.unwrap(), bytes);
    assert_eq!(
        client
            .download_blob(uri, Some((1_048_570, 1_048_580)))
            .await
            .unwrap(),
        bytes[1_048_570..=1_048_580]
    );
    let other = Client::new(vec![s.base.clone()], token("globex", &[Role::Reader]));
    match other.download_blob(uri, None).await {
        Err(ClientError::Refused { status: 404, .. }) => {}
        other => panic!("another tenant's blob: {other:?}"),
    }
    s.stop().await;
}
