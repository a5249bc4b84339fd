from tests.test_browser_dashboard import *
@pytest.mark.browser
class Dbg(BrowserCase):
    def test_dbg(self):
        self.sign_in_as("operator", staff=True)
        self.page.goto(f"{self.live_server_url}/slots/?configuration=akri-onvif")
        print(self.page.locator("#main").inner_text()[:1500])
        links = self.page.get_by_role("link").all()
        print([l.inner_text() for l in links][:30])
