package io.lightstore.ycsb;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNull;

import java.util.Map;
import java.util.Properties;
import org.junit.jupiter.api.Test;

/** The password comes from the property, else LIGHTSTORE_PASSWORD, as in the Rust tools. */
class PasswordTest {
  @Test
  void propertyWinsThenEnvironmentThenNone() {
    Properties p = new Properties();
    assertNull(LightStoreClient.password(p, Map.of()));
    assertNull(LightStoreClient.password(p, Map.of("LIGHTSTORE_PASSWORD", "")));
    assertEquals("env", LightStoreClient.password(p, Map.of("LIGHTSTORE_PASSWORD", "env")));
    p.setProperty("lightstore.password", "prop");
    assertEquals("prop", LightStoreClient.password(p, Map.of("LIGHTSTORE_PASSWORD", "env")));
    p.setProperty("lightstore.password", "");
    assertEquals("env", LightStoreClient.password(p, Map.of("LIGHTSTORE_PASSWORD", "env")));
  }
}
